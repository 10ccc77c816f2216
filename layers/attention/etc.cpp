#include "tapeformer/layers/attention/etc.h"

#include <algorithm>
#include <cmath>

#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/sparse.h"

namespace tapeformer {
namespace {

// Global s (query row s) pools the locals of segment s.
class OwnSegment : public SparsePattern {
 public:
  explicit OwnSegment(int64_t s) : s_(s) {}
  bool sees(int64_t g, int64_t j) const override { return j / s_ == g; }
  void candidates(int64_t g0, int64_t g1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    r.push_back({g0 * s_, g1 * s_});
  }

 private:
  int64_t s_;
};

// Keys [n_g globals | T locals], local i at query position n_g + i: global g
// when its segment is complete before i's (g < i / s), local j when
// i - r <= j <= i.
class GlobalLocal : public SparsePattern {
 public:
  GlobalLocal(int64_t n_g, int64_t s, int64_t r) : n_g_(n_g), s_(s), r_(r) {}
  bool sees(int64_t a, int64_t b) const override {
    const int64_t i = a - n_g_;
    if (b < n_g_) return b < i / s_;
    const int64_t d = i - (b - n_g_);
    return d >= 0 && d <= r_;
  }
  void candidates(int64_t a0, int64_t a1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    if (n_g_ > 0) r.push_back({0, std::min(n_g_, (a1 - 1 - n_g_) / s_)});
    r.push_back({n_g_ + std::max<int64_t>(0, a0 - n_g_ - r_), a1});
  }

 private:
  int64_t n_g_, s_, r_;
};

// The label biases as a learned term of the kernel: b_h[i - j] on local
// keys, b_h[r + 1] on global keys (hidden pairs are the tiles' business).
//   dlabels[h, l] = sum over b and the pairs of label l of dS
class LabelTerm : public kernels::ScoreTerm {
 public:
  LabelTerm(const Tensor& table, int64_t n_g) : table_(table.contiguous()), n_g_(n_g), n_(table.dim(1)) {}
  void check(int64_t, int64_t H, int64_t, int64_t) const override {
    TAPEFORMER_CHECK(table_.dim(0) == H, "etc_attention: the label table ", table_.shape(), " must have the ", H,
                     " heads of q");
  }
  int64_t label(const kernels::ScoreRow& r, int64_t j) const {
    if (j < n_g_) return n_ - 1;
    const int64_t d = r.i - (j - n_g_);
    return d >= 0 && d < n_ - 1 ? d : -1;
  }
  void add(const kernels::ScoreRow& r, Scalar* sum) const override {
    const Scalar* row = table_.data() + r.h * n_;
    for (int64_t x = 0; x < r.n; ++x) {
      const int64_t l = label(r, r.key(x));
      if (l >= 0) sum[x] += row[l];
    }
  }
  int64_t partial_size() const override { return n_; }
  void add_gradient(const kernels::ScoreRow& r, const Scalar* ds, Scalar* part) const override {
    for (int64_t x = 0; x < r.n; ++x) {
      const int64_t l = label(r, r.key(x));
      if (l >= 0) part[l] += ds[x];
    }
  }
  void fold_gradient(int64_t, int64_t h, const Scalar* part, Scalar* grad) const override {
    for (int64_t l = 0; l < n_; ++l) grad[h * n_ + l] += part[l];
  }

 private:
  Tensor table_;  // (H, r + 2)
  int64_t n_g_, n_;
};

}  // namespace

Var etc_attention(const Var& q, const Var& k, const Var& v, const Var& q_g, const Var& labels, int64_t segment,
                  int64_t radius, float p, Rng* rng, const TileCache* tiles) {
  TAPEFORMER_CHECK(q.rank() == 4 && k.shape() == q.shape() && v.shape() == q.shape(), "etc_attention: q ", q.shape(),
                   ", k ", k.shape(), " and v ", v.shape(), " must be the same (B, H, T, D)");
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), D = q.dim(3);
  TAPEFORMER_CHECK(segment >= 0 && radius >= 0, "etc_attention: segment ", segment, " and radius ", radius,
                   " must be >= 0");
  TAPEFORMER_CHECK(q_g.shape() == Shape({H, D}) && labels.shape() == Shape({H, radius + 2}), "etc_attention: q_g ",
                   q_g.shape(), " and labels ", labels.shape(), " must be (H, D) = (", H, ", ", D,
                   ") and (H, r + 2) = (", H, ", ", radius + 2, ")");
  // Globals some later local sees: the segments complete before the last position's.
  const int64_t n_g = segment > 0 ? (T - 1) / segment : 0;
  Var keys = k, values = v;
  if (n_g > 0) {  // g2l: each global pools its segment's keys and values with one softmax
    const int64_t covered = n_g * segment;
    AttentionSpec pool;
    pool.causal = false;
    pool.blocks = TileCache::get(tiles, {1, n_g, segment, 0, 0},
                         [&] { return tile_pattern(OwnSegment(segment), n_g, covered, 0, 0); });
    const Var queries = expand(reshape(q_g, {1, H, 1, D}), {B, H, n_g, D});
    const Var kv = softmax_attention(queries, slice(k, 2, 0, covered),
                                     concat({slice(k, 2, 0, covered), slice(v, 2, 0, covered)}, 3), pool);
    keys = concat({slice(kv, 3, 0, D), k}, 2);       // (B, H, n_g + T, D)
    values = concat({slice(kv, 3, D, 2 * D), v}, 2);  // (B, H, n_g + T, D)
  }
  AttentionSpec spec;
  spec.causal = false;  // the pattern is causal
  spec.blocks = TileCache::get(tiles, {2, T, n_g, segment, radius},
                       [&] { return tile_pattern(GlobalLocal(n_g, std::max<int64_t>(segment, 1), radius), T,
                                                 n_g + T, n_g, 0); });
  spec.terms = {{std::make_shared<LabelTerm>(labels.value(), n_g), labels}};
  spec.dropout_p = p;
  spec.rng = rng;
  return softmax_attention(q, keys, values, spec);  // (B, H, T, D)
}

EtcAttention::EtcAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng)
    : RerunsWindow("EtcAttention", std::move(pos), cfg.n_embd, cfg.n_head, cfg.dropout),
      segment(cfg.option_int("etc_segment")),
      radius(cfg.option_int("etc_radius")) {
  TAPEFORMER_CHECK(segment >= 0 && radius >= 0, "model.etc_segment and model.etc_radius must be >= 0");
  init_projections(cfg.bias, residual_init_std(cfg), rng);
  Tensor e = Tensor::empty({n_embd});
  rng.fill_normal(e, 0.0f, 0.02f);
  global = register_parameter("global", e);
  labels = register_parameter("labels", Tensor::zeros({n_head, radius + 2}));  // no bias at init
}

Var EtcAttention::forward(const Var& x, Rng& rng) const {
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, "EtcAttention: input ", x.shape(), " must be (B, T, ", n_embd,
                   ")");
  const std::vector<Var> h = heads(x);  // q, k, v (B, H, T, D)
  const int64_t D = n_embd / n_head;
  // The global query: the embedding through the layer's query projection, per head.
  const Var q_g = reshape(slice(qkv->forward(reshape(global, {1, 1, n_embd})), 2, 0, n_embd), {n_head, D});
  const PositionalLayer& pos = positional();
  return output(etc_attention(pos.rotate(h[0], 0), pos.rotate(h[1], 0), h[2], q_g, labels, segment, radius,
                              live_dropout(), &rng, &tiles_),
                rng);
}

// ---- the registry entry ---------------------------------------------------------

AttentionKind etc_attention_kind() {
  AttentionKind kind;
  kind.name = "etc";
  kind.summary = "ETC global-local attention (Ainslie et al. 2020), causal: a global token per complete segment pools "
                 "it, and each token attends to the globals of earlier segments and to the tokens within a radius, "
                 "with learned relative-label biases; generates by re-running the window";
  kind.options = {{"etc_segment", int64_t{32}, "etc: positions per segment, one global token each (0: none)",
                   int64_t{4}},
                  {"etc_radius", int64_t{32}, "etc: r, how far back a token sees its neighbours", int64_t{3}}};
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
    return std::make_shared<EtcAttention>(cfg, std::move(pos), rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    return ProjectedAttention::projection_parameters(cfg) + static_cast<double>(cfg.n_embd) +
           static_cast<double>(cfg.n_head) * static_cast<double>(std::max<int64_t>(cfg.option_int("etc_radius"), 0) + 2);
  };
  kind.check = [](const ModelConfig& cfg, const PositionalKind& pos) {
    TAPEFORMER_CHECK(cfg.option_int("etc_segment") >= 0 && cfg.option_int("etc_radius") >= 0,
                     "model.etc_segment and model.etc_radius must be >= 0, got ", cfg.option_int("etc_segment"),
                     " and ", cfg.option_int("etc_radius"));
    refuse_pair_terms(pos, PairTerms::scores_and_rotations, "etc",
                      "it works by the positions of query and key, and a global token's key pools a segment: it has "
                      "no one position");
  };
  kind.causality = Causality::strict;
  return kind;
}

}  // namespace tapeformer
