#include "tapeformer/layers/attention/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <typeinfo>

#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/attention.h"
#include "tapeformer/layers/attention/sparse.h"

namespace tapeformer {
namespace {

// [Tq, Tk] with 1 where key j is in the future of query i (j > i + Tk - Tq).
Tensor causal_mask(int64_t Tq, int64_t Tk) {
  Tensor m = Tensor::zeros({Tq, Tk});
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = i + (Tk - Tq) + 1; j < Tk; ++j) m.at({i, j}) = 1.0f;
  return m;
}

}  // namespace

Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v, bool causal,
                                 float dropout_p, Rng* rng) {
  TAPEFORMER_CHECK(q.rank() == 4 && k.rank() == 4 && v.rank() == 4,
                   "attention: q, k, v must be (B, H, T, D), got ", q.shape(), ", ", k.shape(), ", ",
                   v.shape());
  TAPEFORMER_CHECK(k.shape() == v.shape() && q.dim(3) == k.dim(3) && q.dim(0) == k.dim(0) &&
                       q.dim(1) == k.dim(1),
                   "attention: incompatible q ", q.shape(), ", k ", k.shape(), ", v ", v.shape());
  const int64_t Tq = q.dim(2), Tk = k.dim(2), D = q.dim(3);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Var scores = mul_scalar(matmul(q, transpose(k, 2, 3)), scale);  // (B, H, Tq, Tk)
  // -inf, not a large negative number: masked probabilities are exactly 0.
  if (causal) scores = masked_fill(scores, causal_mask(Tq, Tk), -INFINITY);
  Var att = softmax(scores);  // (B, H, Tq, Tk)
  if (dropout_p > 0.0f) {
    TAPEFORMER_CHECK(rng != nullptr, "attention: dropout needs an Rng");
    att = dropout(att, dropout_p, *rng);
  }
  return matmul(att, v);  // (B, H, Tq, D)
}

Var composed_attention(const Var& qkv, int64_t n_head, bool causal, float dropout_p, Rng* rng) {
  TAPEFORMER_CHECK(qkv.rank() == 3 && qkv.dim(2) % (3 * n_head) == 0, "composed_attention: qkv ", qkv.shape(),
                   " must be (B, T, 3C) with C divisible by n_head ", n_head);
  const std::vector<Var> h = split_heads(qkv, n_head);  // q, k, v (B, H, T, D)
  const Var &q = h[0], &k = h[1], &v = h[2];
  return merge_heads(scaled_dot_product_attention(q, k, v, causal, dropout_p, rng));  // (B, T, C)
}

// ---- KVCache ------------------------------------------------------------------

KVCache::KVCache(int64_t batch, int64_t n_head, int64_t head_dim, int64_t window)
    : batch_(batch), heads_(n_head), dim_(head_dim), window_(window) {
  TAPEFORMER_CHECK(batch > 0 && n_head > 0 && head_dim > 0, "KVCache: batch ", batch, ", heads ", n_head,
                   " and head dim ", head_dim, " must all be >= 1");
  TAPEFORMER_CHECK(window >= 1 || window == -1, "KVCache: window must be >= 1 (or -1 for all positions), got ",
                   window);
}

// Grows the buffers to hold n positions (doubling, capped at the window),
// keeping the held ones.
void KVCache::reserve(int64_t n) {
  const int64_t capacity = k_.defined() ? k_.dim(2) : 0;
  if (n <= capacity) return;
  int64_t grown = std::max<int64_t>({n, 2 * capacity, 16});
  if (window_ > 0) grown = std::min(grown, window_);
  Tensor k = Tensor::empty({batch_, heads_, grown, dim_}), v = Tensor::empty(k.shape());  // (B, H, capacity, D)
  if (held_ > 0) {
    k.slice(2, 0, held_).copy_from(k_.slice(2, 0, held_));
    v.slice(2, 0, held_).copy_from(v_.slice(2, 0, held_));
  }
  k_ = k;
  v_ = v;
}

KVCache::Window KVCache::append(const Tensor& k, const Tensor& v) {
  TAPEFORMER_CHECK(k.rank() == 4 && k.shape() == v.shape() && k.dim(0) == batch_ && k.dim(1) == heads_ &&
                       k.dim(3) == dim_,
                   "KVCache: k ", k.shape(), " and v ", v.shape(), " must both be (", batch_, ", ", heads_, ", T, ",
                   dim_, ")");
  const int64_t T = k.dim(2);
  TAPEFORMER_CHECK(window_ < 0 || T <= window_, "KVCache: ", T, " new positions do not fit in its window of ",
                   window_);
  // Past the window the oldest positions drop out: shift the rest down.
  const int64_t drop = window_ > 0 ? std::max<int64_t>(0, held_ + T - window_) : 0;
  if (drop > 0) {
    const int64_t capacity = k_.dim(2), keep = held_ - drop;
    for (Tensor* t : {&k_, &v_})
      for (int64_t bh = 0; bh < batch_ * heads_; ++bh) {
        Scalar* row = t->data() + bh * capacity * dim_;  // (capacity, D) of one (b, h)
        std::memmove(row, row + drop * dim_, static_cast<size_t>(keep * dim_) * sizeof(Scalar));
      }
    held_ = keep;
  }
  reserve(held_ + T);
  k_.slice(2, held_, held_ + T).copy_from(k);
  v_.slice(2, held_, held_ + T).copy_from(v);
  held_ += T;
  seen_ += T;
  return {k_.slice(2, 0, held_), v_.slice(2, 0, held_), seen_ - held_};  // (B, H, held, D) each
}

// ---- MultiHeadAttention -------------------------------------------------------

MultiHeadAttention::MultiHeadAttention(int64_t n_embd_, int64_t n_head_, bool bias, float dropout,
                                       float proj_init_std, Rng& rng, std::shared_ptr<PositionalLayer> pos,
                                       std::shared_ptr<const SparsePattern> pattern, bool causal)
    : ProjectedAttention("MultiHeadAttention", std::move(pos), n_embd_, n_head_, dropout),
      pattern_(std::move(pattern)),
      causal_(causal) {
  TAPEFORMER_CHECK(causal_ || pattern_ == nullptr, "MultiHeadAttention: a sparse pattern is causal");
  init_projections(bias, proj_init_std, rng);
}

bool MultiHeadAttention::plain() const {
  const PositionalNeeds& n = positional().needs();
  return !n.rotates_qk && !n.score_bias && !n.relative_terms && pattern_ == nullptr;
}

std::shared_ptr<const kernels::BlockMask> MultiHeadAttention::tiles(int64_t group, const SparsePattern& p,
                                                                        int64_t Tq, int64_t Tk, int64_t q0,
                                                                        int64_t k0) const {
  return tiles_.get({group, Tq, Tk, q0, k0}, [&] { return tile_pattern(p, Tq, Tk, q0, k0); });
}

Var MultiHeadAttention::attend(const Var& q, const Var& k, const Var& v, int64_t q0, int64_t k0, float p,
                               Rng* rng) const {
  const PositionalLayer& pos = positional();
  const int64_t Tq = q.dim(2), Tk = k.dim(2);
  const std::vector<Tensor> bias = pos.score_bias(n_head, Tq, Tk, q0, k0);
  if (pattern_) {
    TAPEFORMER_CHECK(!pos.needs().relative_terms, "sparse attention has no per-pair score terms");
    return sparse_attention(*pattern_, q, k, v, bias, q0, k0, p, rng,
                            [&](int64_t group, const SparsePattern& pg) { return tiles(group, pg, Tq, Tk, q0, k0); });
  }
  if (!pos.needs().relative_terms) {
    AttentionSpec spec;
    spec.causal = causal_;
    spec.bias = bias;
    spec.dropout_p = p;
    spec.rng = rng;
    return softmax_attention(q, k, v, spec);
  }
  // Learned per-(i, j) terms: the scores exist as a tensor, so compose.
  const float scale = 1.0f / std::sqrt(static_cast<float>(q.dim(3)));
  Var scores = mul_scalar(add(matmul(q, transpose(k, 2, 3)), pos.score_terms(q, k, q0, k0)), scale);  // (B, H, Tq, Tk)
  for (const Tensor& b : bias) scores = add(scores, Var(b));
  if (causal_) scores = masked_fill(scores, causal_mask(Tq, Tk), -INFINITY);
  Var att = softmax(scores);  // (B, H, Tq, Tk)
  if (p > 0.0f) {
    TAPEFORMER_CHECK(rng != nullptr, "MultiHeadAttention: dropout needs an Rng");
    att = dropout(att, p, *rng);
  }
  const Var y = matmul(att, v), value_terms = pos.value_terms(att, q0, k0);  // (B, H, Tq, D)
  return value_terms.defined() ? add(y, value_terms) : y;
}

Var MultiHeadAttention::self_attention(const Var& qkv_x, float p, Rng* rng) const {
  if (plain() && causal_ && qkv_x.dim(1) <= kFusedMaxT) return causal_attention(qkv_x, n_head, p, rng);  // fused, (B, T, C)
  const std::vector<Var> h = split_heads(qkv_x, n_head);  // q, k, v (B, H, T, D)
  const Var &q = h[0], &k = h[1], &v = h[2];
  const PositionalLayer& pos = positional();
  return merge_heads(attend(pos.rotate(q, 0), pos.rotate(k, 0), v, 0, 0, p, rng));  // (B, T, C)
}

Var MultiHeadAttention::forward(const Var& x, Rng& rng) const {
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, "MultiHeadAttention: input ", x.shape(),
                   " must be (B, T, ", n_embd, ")");
  const float p = is_training() ? dropout_p : 0.0f;
  return resid_drop->forward(proj->forward(self_attention(qkv->forward(x), p, &rng)), rng);
}

Var MultiHeadAttention::forward(const Var& x, const Var& memory, Rng& rng) const {
  if (!memory.defined() || memory.dim(1) == 0) return forward(x, rng);
  return project(attend_with_heads(x, memory, rng).y, rng);
}

ProjectedAttention::Attended MultiHeadAttention::attend_with_heads(const Var& x, const Var& memory, Rng& rng) const {
  TAPEFORMER_CHECK(causal_, "MultiHeadAttention: a Transformer-XL memory needs causal attention");
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd &&
                       (!memory.defined() || (memory.rank() == 3 && memory.dim(0) == x.dim(0) && memory.dim(2) == n_embd)),
                   "MultiHeadAttention: input ", x.shape(), " and memory ", memory.shape(), " must be (B, T, ", n_embd,
                   ") and (B, M, ", n_embd, ")");
  const float p = is_training() ? dropout_p : 0.0f;
  const Var qkv_x = qkv->forward(x);  // (B, T, 3C)
  const Var y = local_attention(qkv_x, memory, p, rng);  // (B, T, C)
  return {y, qkv_x};
}

Var MultiHeadAttention::local_attention(const Var& qkv_x, const Var& memory, float p, Rng& rng) const {
  if (!memory.defined() || memory.dim(1) == 0) return self_attention(qkv_x, p, &rng);
  const int64_t B = qkv_x.dim(0), M = memory.dim(1), D = n_embd / n_head;
  const std::vector<Var> h = split_heads(qkv_x, n_head);  // q, k, v of x, (B, H, T, D)
  const Var kv = linear(memory, slice(qkv->weight, 1, n_embd, 3 * n_embd),
                        qkv->bias.defined() ? slice(qkv->bias, 0, n_embd, 3 * n_embd) : Var());  // (B, M, 2C)
  const auto heads = [&](int64_t c0) {  // columns c0..c0+C of kv as (B, H, M, D)
    return permute(reshape(slice(kv, 2, c0, c0 + n_embd), {B, M, n_head, D}), {0, 2, 1, 3});
  };
  const PositionalLayer& pos = positional();
  const Var k = concat({pos.rotate(heads(0), 0), pos.rotate(h[1], M)}, 2);  // (B, H, M + T, D)
  const Var v = concat({heads(n_embd), h[2]}, 2);
  return merge_heads(attend(pos.rotate(h[0], M), k, v, M, 0, p, &rng));  // (B, T, C)
}

Var MultiHeadAttention::content_attention(const Var& x, const Var& rows) const {
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd && rows.rank() == 3 && rows.dim(0) == x.dim(0) &&
                       rows.dim(2) == n_embd,
                   "MultiHeadAttention: queries ", x.shape(), " and rows ", rows.shape(), " must be (B, T, ", n_embd,
                   ") and (B, N, ", n_embd, ")");
  const int64_t C = n_embd, D = C / n_head;
  const Var w = detach(qkv->weight), b = qkv->bias.defined() ? detach(qkv->bias) : Var();  // held fixed
  const auto part = [&](const Var& in, int64_t c0) {  // columns c0..c0+C of the projection, as (B, H, n, D)
    const Var y = linear(in, slice(w, 1, c0, c0 + C), b.defined() ? slice(b, 0, c0, c0 + C) : Var());
    return permute(reshape(y, {in.dim(0), in.dim(1), n_head, D}), {0, 2, 1, 3});
  };
  return merge_heads(scaled_dot_product_attention(part(x, 0), part(rows, C), part(rows, 2 * C), false, 0.0f, nullptr));
}

std::unique_ptr<InferenceState> MultiHeadAttention::make_state(int64_t batch, int64_t window) const {
  TAPEFORMER_CHECK(causal_, "MultiHeadAttention: a bidirectional layer has no incremental form (no inference state)");
  return std::make_unique<KVCache>(batch, n_head, n_embd / n_head, window);
}

Var MultiHeadAttention::forward(const Var& x, InferenceState& state) const {
  check_inference(x);
  KVCache& cache = state_as<KVCache>(state, "MultiHeadAttention", "KVCache");
  const Var qkv_x = qkv->forward(x);  // (B, T, 3C)
  const int64_t q0 = cache.length();  // absolute position of x's first row
  const std::vector<Var> h = split_heads(qkv_x, n_head);  // q, k, v of the new positions, (B, H, T, D)
  const Var &q = h[0], &k_new = h[1], &v_new = h[2];
  const PositionalLayer& pos = positional();
  // Keys are rotated once, at their own position, as they enter the cache.
  const KVCache::Window w = cache.append(pos.rotate(k_new, q0).value(), v_new.value());  // (B, H, held, D)
  // From an empty cache a plain layer runs forward()'s fused kernel, so a
  // sequence fed whole gives bit-identical outputs.
  const bool fused = q0 == 0 && plain() && x.dim(1) <= kFusedMaxT;  // plain: dense too
  const Var y = fused ? causal_attention(qkv_x, n_head)  // (B, T, C)
                      : merge_heads(attend(pos.rotate(q, q0), Var(w.k), Var(w.v), q0, w.start, 0.0f, nullptr));
  return proj->forward(y);  // (B, T, C)
}

Var MultiHeadAttention::forward_rows(const Var& x, InferenceState& state, const std::vector<int64_t>& rows) const {
  // A kind built on this one that reads its past otherwise (its own forward(x, state)) gets the general rows.
  if (typeid(*this) != typeid(MultiHeadAttention)) return Attention::forward_rows(x, state, rows);
  check_inference(x);
  check_rows(rows, x.dim(0) * x.dim(1), "MultiHeadAttention::forward_rows");  // before the cache takes x in
  KVCache& cache = state_as<KVCache>(state, "MultiHeadAttention", "KVCache");
  const int64_t B = x.dim(0), T = x.dim(1), C = n_embd, D = C / n_head, q0 = cache.length();
  const PositionalLayer& pos = positional();
  const Var w = qkv->weight, b = qkv->bias;
  const auto part = [&](const Var& in, int64_t c0, int64_t c1) {  // columns [c0, c1) of the projection
    return linear(in, slice(w, 1, c0, c1), b.defined() ? slice(b, 0, c0, c1) : Var());
  };
  // After cached positions, with positional terms or long rows, forward(x, state) runs another kernel: its rows.
  if (!rows.empty() && !(q0 == 0 && plain() && T <= kFusedMaxT)) return pick_rows(forward(x, state), rows);
  // The keys and values of every position: columns [C, 3C) of the projection
  // (each element of a product sums over the same inputs in the same order,
  // whichever columns and rows are asked).
  const Tensor kv = part(x, C, 3 * C).value().contiguous();  // (B, T, 2C)
  const auto heads = [&](int64_t c0) {  // (B, H, T, D) view of kv's columns [c0, c0 + C)
    return permute(reshape(slice(Var(kv), 2, c0, c0 + C), {B, T, n_head, D}), {0, 2, 1, 3});
  };
  cache.append(pos.rotate(heads(0), q0).value(), heads(C).value());
  if (rows.empty()) return Var(Tensor::zeros({1, 0, C}));
  // From an empty cache forward(x, state) runs the fused kernel: its rows
  // alone, with queries for them only.
  const Tensor q = part(pick_rows(x, rows), 0, C).value().contiguous();  // (1, R, C)
  Tensor packed = Tensor::zeros({B, T, 3 * C});  // [q | k | v], q of `rows` only
  const auto R = static_cast<int64_t>(rows.size());
  for (int64_t i = 0; i < B * T; ++i) std::copy_n(kv.data() + i * 2 * C, 2 * C, packed.data() + i * 3 * C + C);
  for (int64_t r = 0; r < R; ++r) std::copy_n(q.data() + r * C, C, packed.data() + rows[r] * 3 * C);
  Tensor y = Tensor::empty({1, R, C});
  kernels::causal_attention_rows(packed.data(), rows.data(), R, y.data(), {B, T, n_head, D});
  return proj->forward(Var(y));  // (1, R, C)
}

// ---- the registry entry ---------------------------------------------------------

AttentionKind softmax_attention_kind() {
  AttentionKind kind;
  kind.name = "softmax";
  kind.summary = "multi-head scaled dot-product attention (Vaswani et al. 2017), causal or bidirectional; a fused kernel "
                 "for short rows with no positional terms, else a memory-lean one (row log-sum-exp, tiles recomputed in "
                 "the backward); generates with a KV cache";
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
    return std::make_shared<MultiHeadAttention>(cfg.n_embd, cfg.n_head, cfg.bias, cfg.dropout,
                                                residual_init_std(cfg), rng, std::move(pos), nullptr, cfg.causal);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    return ProjectedAttention::projection_parameters(cfg);
  };
  kind.check = [](const ModelConfig&, const PositionalKind&) {};  // every scheme's math is softmax attention's
  kind.segment_memory = true;
  kind.causality = Causality::either;
  return kind;
}

}  // namespace tapeformer
