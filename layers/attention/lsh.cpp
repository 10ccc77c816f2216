#include "tapeformer/layers/attention/lsh.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/layers/attention/sparse.h"

namespace tapeformer {
namespace {

// Sorted rows in chunks of m: a chunk sees itself and the chunk before.
class ChunkLocal : public SparsePattern {
 public:
  explicit ChunkLocal(int64_t m) : m_(m) {}
  bool sees(int64_t a, int64_t b) const override { return b / m_ == a / m_ || b / m_ == a / m_ - 1; }
  void candidates(int64_t a0, int64_t a1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    r.push_back({(a0 / m_ - 1) * m_, ((a1 - 1) / m_ + 1) * m_});  // through the end of the last query's chunk
  }

 private:
  int64_t m_;
};

}  // namespace

// ---- PositionMask ---------------------------------------------------------------

PositionMask::PositionMask(IndexTensor q_pos, IndexTensor k_pos, bool no_self)
    : q_pos_(std::move(q_pos)), k_pos_(std::move(k_pos)), no_self_(no_self) {
  TAPEFORMER_CHECK(q_pos_.shape.rank() == 3 && k_pos_.shape.rank() == 3 && q_pos_.shape[0] == k_pos_.shape[0] &&
                       q_pos_.shape[1] == k_pos_.shape[1],
                   "PositionMask: q_pos ", q_pos_.shape, " and k_pos ", k_pos_.shape,
                   " must be (B, H, Tq) and (B, H, Tk)");
  heads_ = q_pos_.shape[1];
  if (!no_self_) return;
  const int64_t BH = q_pos_.shape[0] * q_pos_.shape[1], Tq = q_pos_.shape[2], Tk = k_pos_.shape[2];
  self_row_.assign(static_cast<size_t>(BH * Tq), -1);  // each query's own key row, by position
  std::unordered_map<int32_t, int32_t> row_of_position;
  for (int64_t bh = 0; bh < BH; ++bh) {
    row_of_position.clear();
    for (int64_t j = 0; j < Tk; ++j) row_of_position[k_pos_.data[static_cast<size_t>(bh * Tk + j)]] = static_cast<int32_t>(j);
    for (int64_t i = 0; i < Tq; ++i) {
      const auto it = row_of_position.find(q_pos_.data[static_cast<size_t>(bh * Tq + i)]);
      if (it != row_of_position.end()) self_row_[static_cast<size_t>(bh * Tq + i)] = it->second;
    }
  }
}

void PositionMask::check(int64_t B, int64_t H, int64_t Tq, int64_t Tk) const {
  TAPEFORMER_CHECK(q_pos_.shape == Shape({B, H, Tq}) && k_pos_.shape == Shape({B, H, Tk}), "PositionMask: q_pos ",
                   q_pos_.shape, " and k_pos ", k_pos_.shape, " must be (B, H, Tq) = (", B, ", ", H, ", ", Tq,
                   ") and (B, H, Tk) = (", B, ", ", H, ", ", Tk, ")");
}

void PositionMask::apply(const kernels::ScoreRow& r, Scalar* s) const {
  const int64_t bh = r.b * heads_ + r.h;
  const int32_t qp = q_pos_.data[static_cast<size_t>(bh * r.Tq + r.i)];
  const int32_t* kp = k_pos_.data.data() + bh * r.Tk + r.j0;
  constexpr Scalar kHidden = -std::numeric_limits<Scalar>::infinity();
  if (r.step == 1) {
    if (no_self_) {
      for (int64_t x = 0; x < r.n; ++x)
        if (kp[x] >= qp) s[x] = kHidden;
    } else {
      for (int64_t x = 0; x < r.n; ++x)
        if (kp[x] > qp) s[x] = kHidden;
    }
    return;
  }
  for (int64_t x = 0; x < r.n; ++x) {
    const int32_t p = kp[x * r.step];
    if (p > qp || (no_self_ && p == qp)) s[x] = kHidden;
  }
}

int64_t PositionMask::fallback(int64_t b, int64_t h, int64_t i) const {
  if (!no_self_) return -1;
  return self_row_[static_cast<size_t>((b * heads_ + h) * q_pos_.shape[2] + i)];
}

LSHAttention::LSHAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng)
    : RerunsWindow("LSHAttention", std::move(pos), cfg.n_embd, cfg.n_head, cfg.dropout),
      n_buckets(cfg.option_int("lsh_buckets")),
      n_hashes(cfg.option_int("lsh_hashes")),
      chunk(cfg.option_int("lsh_chunk")) {
  TAPEFORMER_CHECK(n_buckets >= 2 && n_buckets % 2 == 0 && n_hashes >= 1 && chunk >= 1,
                   "model.lsh_buckets must be even and >= 2, model.lsh_hashes and model.lsh_chunk >= 1");
  init_projections(cfg.bias, residual_init_std(cfg), rng, Projection::shared_qk);
  eval_seed_ = rng.next_u64();  // the init stream: a replica or a resumed model draws the same
}

void LSHAttention::set_hashes(int64_t n) {
  TAPEFORMER_CHECK(n >= 1, "LSHAttention: hashing rounds must be >= 1, got ", n);
  n_hashes = n;
}

Var LSHAttention::forward(const Var& x, Rng& rng) const {
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, "LSHAttention: input ", x.shape(), " must be (B, T, ", n_embd,
                   ")");
  const int64_t B = x.dim(0), T = x.dim(1), H = n_head, D = n_embd / n_head;
  const float p = is_training() ? dropout_p : 0.0f;
  const std::vector<Var> h = heads(x);  // the shared q = k, and v: (B, H, T, D)
  const Var q = positional().rotate(h[0], 0), v = h[2];
  const Var k = div(q, add_scalar(sqrt(sum(mul(q, q), {-1}, true)), 1e-6f));  // unit keys
  const Tensor kc = k.value().contiguous();
  Rng rotations = is_training() ? Rng(rng.next_u64()) : Rng(eval_seed_);
  const auto tiles = tiles_.get({T, chunk, 0, 0, 0}, [&] { return tile_pattern(ChunkLocal(chunk), T, T, 0, 0); });
  const int64_t half = n_buckets / 2;
  std::vector<Var> ys, lses;
  std::vector<int32_t> bucket(static_cast<size_t>(T)), order(static_cast<size_t>(B * H * T)),
      inverse(static_cast<size_t>(B * H * T));
  Tensor projected = Tensor::empty({B * H * T, half});  // k R, (B H T, n_b / 2)
  for (int64_t r = 0; r < n_hashes; ++r) {
    Tensor R = Tensor::empty({D, half});  // (D, n_b / 2)
    rotations.fill_normal(R, 0.0f, 1.0f);
    // One product for every row (n_b grows with T in Reformer's setting, so
    // the hash is O(T^2 D / chunk) and must run at GEMM speed).
    parallel::parallel_for(B * H, 1, [&](int64_t s0, int64_t s1) {  // rows split by slice: the same sums in any case
      kernels::gemm({kc.data() + s0 * T * D, (s1 - s0) * T, D, D, 1}, {R.data(), D, half, half, 1},
                    projected.data() + s0 * T * half, half, false);
    });
    for (int64_t bh = 0; bh < B * H; ++bh) {
      for (int64_t t = 0; t < T; ++t) {  // argmax([k R; -k R])
        const Scalar* kr = projected.data() + (bh * T + t) * half;
        Scalar best = -std::numeric_limits<Scalar>::infinity();
        for (int64_t c = 0; c < half; ++c) {
          if (kr[c] > best) best = kr[c], bucket[static_cast<size_t>(t)] = static_cast<int32_t>(c);
          if (-kr[c] > best) best = -kr[c], bucket[static_cast<size_t>(t)] = static_cast<int32_t>(c + half);
        }
      }
      int32_t* o = order.data() + bh * T;
      std::iota(o, o + T, 0);
      std::stable_sort(o, o + T, [&](int32_t a, int32_t b) { return bucket[a] < bucket[b]; });  // then by position
      for (int64_t t = 0; t < T; ++t) inverse[static_cast<size_t>(bh * T + o[t])] = static_cast<int32_t>(t);
    }
    const IndexTensor sorted({B, H, T}, order), back({B, H, T}, inverse);
    AttentionSpec spec;
    spec.causal = false;  // the mask compares positions
    spec.blocks = tiles;
    spec.masks = {std::make_shared<PositionMask>(sorted, sorted, /*no_self=*/true)};
    spec.dropout_p = p;
    spec.rng = &rng;
    Var lse;
    const Var y_r = softmax_attention(gather_rows(q, sorted), gather_rows(k, sorted), gather_rows(v, sorted), spec, &lse);
    ys.push_back(gather_rows(y_r, back));                            // (B, H, T, D) in position order
    lses.push_back(gather_rows(reshape(lse, {B, H, T, 1}), back));  // (B, H, T, 1)
  }
  Var y = ys[0];
  if (n_hashes > 1) {  // rounds weighted by softmax over their log-sum-exps
    const Var w = softmax(concat(lses, 3));  // (B, H, T, rounds)
    y = mul(ys[0], slice(w, 3, 0, 1));
    for (int64_t r = 1; r < n_hashes; ++r) y = add(y, mul(ys[static_cast<size_t>(r)], slice(w, 3, r, r + 1)));
  }
  return output(y, rng);  // (B, T, C)
}

// ---- the registry entry ---------------------------------------------------------

AttentionKind lsh_attention_kind() {
  AttentionKind kind;
  kind.name = "lsh";
  kind.summary = "Reformer's LSH attention (Kitaev et al. 2020): shared-QK, random-rotation hashing into buckets, sorted "
                 "chunks attending to themselves and the one before, rounds combined by their log-sum-exps; generates by "
                 "re-running the window";
  kind.options = {{"lsh_buckets", int64_t{8}, "lsh: buckets per round (even)", int64_t{2}},
                  {"lsh_hashes", int64_t{2}, "lsh: hashing rounds"},
                  {"lsh_chunk", int64_t{64}, "lsh: chunk of sorted rows (each sees its chunk and the one before)",
                   int64_t{4}}};
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
    return std::make_shared<LSHAttention>(cfg, std::move(pos), rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    return ProjectedAttention::projection_parameters(cfg, ProjectedAttention::Projection::shared_qk);
  };
  kind.check = [](const ModelConfig& cfg, const PositionalKind& pos) {
    const int64_t nb = cfg.option_int("lsh_buckets");
    TAPEFORMER_CHECK(nb >= 2 && nb % 2 == 0, "model.lsh_buckets must be even and >= 2, got ", nb);
    TAPEFORMER_CHECK(cfg.option_int("lsh_hashes") >= 1 && cfg.option_int("lsh_chunk") >= 1,
                     "model.lsh_hashes and model.lsh_chunk must be >= 1");
    refuse_pair_terms(pos, PairTerms::scores, "lsh",
                      "its score terms follow positions, and LSH attention runs its rows in bucket order");
  };
  kind.causality = Causality::chunk_dependent;
  return kind;
}

}  // namespace tapeformer
