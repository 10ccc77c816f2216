#include "tapeformer/layers/attention/sinkhorn.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"

namespace tapeformer {

namespace {

constexpr Scalar kInf = std::numeric_limits<Scalar>::infinity();

// x (B, H, T, D) with zero rows appended up to Tp.
Var pad_rows(const Var& x, int64_t Tp) {
  const int64_t T = x.dim(2);
  if (Tp == T) return x;
  return concat({x, Var(Tensor::zeros({x.dim(0), x.dim(1), Tp - T, x.dim(3)}))}, 2);
}

// Block sums (B, H, N, D) moved one block later: row i holds block i - 1's, row 0 zeros.
Var previous_block(const Var& sums) {
  const int64_t N = sums.dim(2);
  const Var zero(Tensor::zeros({sums.dim(0), sums.dim(1), 1, sums.dim(3)}));
  return N == 1 ? zero : concat({zero, slice(sums, 2, 0, N - 1)}, 2);
}

}  // namespace

Var sinkhorn_attention(const Var& q, const Var& k, const Var& v, const Var& w_p, const SinkhornOptions& o) {
  TAPEFORMER_CHECK(q.rank() == 4 && k.shape() == q.shape() && v.shape() == q.shape(), "sinkhorn_attention: q ",
                   q.shape(), ", k ", k.shape(), " and v ", v.shape(), " must be the same (B, H, T, D)");
  TAPEFORMER_CHECK(o.block >= 1 && o.tau > 0 && o.iters >= 0, "sinkhorn_attention: block ", o.block, ", temperature ",
                   o.tau, " and iterations ", o.iters, " must be >= 1, > 0 and >= 0");
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), D = q.dim(3), b = o.block;
  const int64_t N = (T + b - 1) / b, Tp = N * b;
  TAPEFORMER_CHECK(w_p.rank() == 2 && w_p.dim(0) == 2 * D && w_p.dim(1) >= N, "sinkhorn_attention: the sorting "
                   "network's W_P ", w_p.shape(), " must be (2D, >= blocks) = (", 2 * D, ", >= ", N, ") for ", T,
                   " positions in blocks of ", b);
  // Bidirectional, a padded row of the last block would be mixed into every sorted block as a key.
  TAPEFORMER_CHECK(o.causal || Tp == T, "sinkhorn_attention: bidirectional attention needs the length (", T,
                   ") to be a multiple of the block (", b, ")");
  const Var qb = reshape(contiguous(pad_rows(q, Tp)), {B, H, N, b, D});
  const Var kb = reshape(contiguous(pad_rows(k, Tp)), {B, H, N, b, D});
  const Var vb = reshape(contiguous(pad_rows(v, Tp)), {B, H, N, b, D});

  // The sorting network: R = ReLU([sum q; sum k] W_P), one row per block.
  Var qs = sum(qb, {3}), ks = sum(kb, {3});  // (B, H, N, D)
  if (o.causal) {
    qs = previous_block(qs);
    ks = previous_block(ks);
  }
  const Var R = relu(matmul(concat({qs, ks}, 3), slice(w_p, 1, 0, N)));  // (B, H, N, N)
  Var L = log(add_scalar(R, 1e-6f));
  if (o.gumbel != nullptr) {  // g = -log(-log u)
    Tensor g = Tensor::empty({B, H, N, N});
    o.gumbel->fill_uniform(g, 1e-6f, 1.0f);
    for (int64_t i = 0; i < g.numel(); ++i) g.data()[i] = -std::log(-std::log(g.data()[i]));
    L = add(L, Var(g));
  }
  L = mul_scalar(L, 1.0f / o.tau);
  Var S;
  if (o.causal) {  // rows over the earlier blocks only; block 0 (no earlier block) takes itself, then is hidden
    Tensor hide = Tensor::zeros({N, N});
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = std::max<int64_t>(i, 1); j < N; ++j) hide.at({i, j}) = -kInf;
    S = softmax(add(L, Var(hide)));
  } else {
    for (int64_t it = 0; it < o.iters; ++it) {
      L = log_softmax(L);                                   // rows
      L = transpose(log_softmax(transpose(L, 2, 3)), 2, 3);  // columns
    }
    S = exp(o.iters > 0 ? L : log_softmax(L));
  }

  // Sorted blocks K~ = S K, V~ = S V, then each block's queries over [K~_i; K_i].
  const Var ksort = reshape(matmul(S, reshape(kb, {B, H, N, b * D})), {B, H, N, b, D});
  const Var vsort = reshape(matmul(S, reshape(vb, {B, H, N, b * D})), {B, H, N, b, D});
  const Var keys = reshape(concat({ksort, kb}, 3), {B, H * N, 2 * b, D});
  const Var values = reshape(concat({vsort, vb}, 3), {B, H * N, 2 * b, D});
  AttentionSpec spec;
  spec.causal = o.causal;  // query i of a block (at key position b + i) sees the sorted block and its own up to i
  Tensor hidden = Tensor::zeros({1, H * N, 1, 2 * b});
  bool any = false;
  for (int64_t h = 0; h < H; ++h) {
    if (o.causal)  // block 0 has no earlier block to sort in
      for (int64_t j = 0; j < b; ++j) hidden.at({0, h * N, 0, j}) = -kInf, any = true;
    for (int64_t j = T - (N - 1) * b; j < b; ++j)  // padded keys of the last block
      hidden.at({0, h * N + N - 1, 0, b + j}) = -kInf, any = true;
  }
  if (any) spec.bias = {hidden};
  spec.dropout_p = o.dropout;
  spec.rng = o.dropout_rng;
  const Var y = softmax_attention(reshape(qb, {B, H * N, b, D}), keys, values, spec);  // (B, H N, b, D)
  return slice(reshape(contiguous(y), {B, H, Tp, D}), 2, 0, T);
}

SinkhornAttention::SinkhornAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng)
    : RerunsWindow("SinkhornAttention", std::move(pos), cfg.n_embd, cfg.n_head, cfg.dropout) {
  options.block = cfg.option_int("sinkhorn_block");
  options.tau = static_cast<float>(cfg.option_number("sinkhorn_temperature"));
  options.iters = cfg.option_int("sinkhorn_iters");
  options.causal = cfg.causal;
  TAPEFORMER_CHECK(options.block >= 1 && options.tau > 0 && options.iters >= 0,
                   "model.sinkhorn_block must be >= 1, model.sinkhorn_temperature > 0 and model.sinkhorn_iters >= 0");
  max_blocks = (cfg.block_size + options.block - 1) / options.block;
  init_projections(cfg.bias, residual_init_std(cfg), rng);
  Tensor w = Tensor::empty({2 * (n_embd / n_head), max_blocks});
  rng.fill_normal(w, 0.0f, 1.0f);
  w_p = register_parameter("w_p", w);
}

Var SinkhornAttention::forward(const Var& x, Rng& rng) const {
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, "SinkhornAttention: input ", x.shape(), " must be (B, T, ",
                   n_embd, ")");
  TAPEFORMER_CHECK(x.dim(1) <= max_blocks * options.block, "SinkhornAttention: ", x.dim(1), " positions need more "
                   "than the sorting network's ", max_blocks, " blocks of ", options.block, " (model.block_size)");
  const std::vector<Var> h = heads(x);  // q, k, v (B, H, T, D)
  const PositionalLayer& pos = positional();
  SinkhornOptions o = options;
  o.gumbel = is_training() ? &rng : nullptr;
  o.dropout = live_dropout();
  o.dropout_rng = &rng;
  return output(sinkhorn_attention(pos.rotate(h[0], 0), pos.rotate(h[1], 0), h[2], w_p, o), rng);
}

// ---- the registry entry ---------------------------------------------------------

AttentionKind sinkhorn_attention_kind() {
  AttentionKind kind;
  kind.name = "sinkhorn";
  kind.summary = "Sparse Sinkhorn attention (Tay et al. 2020): a learned sorting network softly permutes blocks "
                 "(Gumbel-Sinkhorn; causal: each block sorts only earlier blocks), each block attends to its sorted "
                 "block and itself; generates by re-running the window";
  kind.options = {{"sinkhorn_block", int64_t{16}, "sinkhorn: b, positions per block", int64_t{4}},
                  {"sinkhorn_temperature", 0.75, "sinkhorn: tau, the temperature of the sorting matrix"},
                  {"sinkhorn_iters", int64_t{7}, "sinkhorn: row and column normalisations (bidirectional; causal "
                                                 "models normalise rows once)"}};
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
    return std::make_shared<SinkhornAttention>(cfg, std::move(pos), rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    const int64_t b = std::max<int64_t>(cfg.option_int("sinkhorn_block"), 1);
    const double blocks = static_cast<double>((cfg.block_size + b - 1) / b);
    return ProjectedAttention::projection_parameters(cfg) + 2.0 * static_cast<double>(cfg.n_embd / cfg.n_head) * blocks;
  };
  kind.check = [](const ModelConfig& cfg, const PositionalKind& pos) {
    refuse_pair_terms(pos, PairTerms::scores, "sinkhorn",
                      "its terms are indexed by position pairs, and the sorted blocks' keys have no one position");
    TAPEFORMER_CHECK(cfg.option_int("sinkhorn_block") >= 1 && cfg.option_number("sinkhorn_temperature") > 0 &&
                         cfg.option_int("sinkhorn_iters") >= 0,
                     "model.sinkhorn_block must be >= 1, model.sinkhorn_temperature > 0 and model.sinkhorn_iters >= 0");
  };
  kind.causality = Causality::either;
  return kind;
}

}  // namespace tapeformer
