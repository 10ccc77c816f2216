#include "tapeformer/layers/attention/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/recompute.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/layers/attention/lsh.h"  // PositionMask
#include "tapeformer/layers/attention/sparse.h"

namespace tapeformer {
namespace {

// Rows in clusters of w: a row sees the rows of its own cluster.
class OwnChunk : public SparsePattern {
 public:
  explicit OwnChunk(int64_t w) : w_(w) {}
  bool sees(int64_t a, int64_t b) const override { return a / w_ == b / w_; }
  void candidates(int64_t a0, int64_t a1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    r.push_back({a0 / w_ * w_, ((a1 - 1) / w_ + 1) * w_});
  }

 private:
  int64_t w_;
};

std::shared_ptr<const kernels::BlockMask> tiles_of(const TileCache* cache, const SparsePattern& p, int64_t kind,
                                                   int64_t T, int64_t w) {
  return TileCache::get(cache, {kind, T, w, 0, 0}, [&] { return tile_pattern(p, T, T, 0, 0); });
}

// x (..., D) rows scaled to unit length (|x| + 1e-6, as LSH's keys).
Tensor unit_rows(const Tensor& x) {
  Tensor u = x.clone();
  const int64_t D = u.dim(u.rank() - 1), rows = D > 0 ? u.numel() / D : 0;
  Scalar* p = u.data();
  for (int64_t r = 0; r < rows; ++r, p += D) {
    double n = 0;
    for (int64_t d = 0; d < D; ++d) n += static_cast<double>(p[d]) * p[d];
    const Scalar inv = 1.0f / (static_cast<Scalar>(std::sqrt(n)) + 1e-6f);
    for (int64_t d = 0; d < D; ++d) p[d] *= inv;
  }
  return u;
}

}  // namespace

IndexTensor routing_clusters(const Tensor& unit_q, const Tensor& mu, int64_t w) {
  TAPEFORMER_CHECK(unit_q.rank() == 4 && mu.rank() == 3 && mu.dim(0) == unit_q.dim(1) && mu.dim(2) == unit_q.dim(3),
                   "routing_clusters: queries ", unit_q.shape(), " and centroids ", mu.shape(),
                   " must be (B, H, T, D) and (H, C, D)");
  const int64_t B = unit_q.dim(0), H = unit_q.dim(1), T = unit_q.dim(2), D = unit_q.dim(3), C = mu.dim(1);
  TAPEFORMER_CHECK(w >= 1 && w <= T, "routing_clusters: ", w, " rows per cluster out of [1, ", T, "]");
  const Tensor q = unit_q.contiguous(), m = mu.contiguous();
  std::vector<int32_t> rows(static_cast<size_t>(B * H * C * w));
  parallel::parallel_for(B * H, 1, [&](int64_t s0, int64_t s1) {
    std::vector<Scalar> sim(static_cast<size_t>(T));
    std::vector<int32_t> order(static_cast<size_t>(T));
    for (int64_t bh = s0; bh < s1; ++bh) {
      const Scalar* qs = q.data() + bh * T * D;
      for (int64_t c = 0; c < C; ++c) {
        const Scalar* mc = m.data() + ((bh % H) * C + c) * D;
        for (int64_t t = 0; t < T; ++t) {
          Scalar s = 0;
          for (int64_t d = 0; d < D; ++d) s += qs[t * D + d] * mc[d];
          sim[static_cast<size_t>(t)] = s;
        }
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + w, order.end(), [&](int32_t a, int32_t b) {
          return sim[a] > sim[b] || (sim[a] == sim[b] && a < b);
        });
        std::sort(order.begin(), order.begin() + w);  // back in position order
        std::copy(order.begin(), order.begin() + w, rows.begin() + (bh * C + c) * w);
      }
    }
  });
  return IndexTensor({B, H, C * w}, std::move(rows));
}

Var routed_attention(const Var& q, const Var& v, const IndexTensor& clusters, int64_t w, float p, Rng* rng,
                     const TileCache* tiles) {
  TAPEFORMER_CHECK(q.rank() == 4 && v.shape() == q.shape(), "routed_attention: q ", q.shape(), " and v ", v.shape(),
                   " must be the same (B, H, T, D)");
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2), D = q.dim(3);
  TAPEFORMER_CHECK(clusters.shape.rank() == 3 && clusters.shape[0] == B && clusters.shape[1] == H && w >= 1 &&
                       clusters.shape[2] % w == 0,
                   "routed_attention: clusters ", clusters.shape, " must be (B, H, C w) with w = ", w);
  const int64_t n = clusters.shape[2];
  const Var qs = gather_rows(q, clusters), vs = gather_rows(v, clusters);  // (B, H, C w, D)
  AttentionSpec spec;
  spec.causal = false;  // the mask compares positions
  spec.blocks = tiles_of(tiles, OwnChunk(w), 1, n, w);
  spec.masks = {std::make_shared<PositionMask>(clusters, clusters, /*no_self=*/true)};
  spec.dropout_p = p;
  spec.rng = rng;
  const Var ys = softmax_attention(qs, qs, vs, spec);  // (B, H, C w, D)

  // Back to positions: the mean over the clusters that took each row, as
  // sum_m gather(ys ++ [0], slot_m) / count (slot m: a row's m-th cluster row, or the zero row).
  std::vector<int32_t> count(static_cast<size_t>(B * H * T), 0);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t r = 0; r < n; ++r) ++count[static_cast<size_t>(bh * T + clusters.data[static_cast<size_t>(bh * n + r)])];
  const int32_t most = *std::max_element(count.begin(), count.end());
  std::vector<std::vector<int32_t>> slots(static_cast<size_t>(most),
                                          std::vector<int32_t>(static_cast<size_t>(B * H * T), static_cast<int32_t>(n)));
  std::vector<int32_t> filled(count.size(), 0);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t r = 0; r < n; ++r) {
      const size_t at = static_cast<size_t>(bh * T + clusters.data[static_cast<size_t>(bh * n + r)]);
      slots[static_cast<size_t>(filled[at]++)][at] = static_cast<int32_t>(r);
    }
  const Var padded = concat({ys, Var(Tensor::zeros({B, H, 1, D}))}, 2);  // (B, H, C w + 1, D)
  Var y;
  for (const std::vector<int32_t>& slot : slots) {
    const Var part = gather_rows(padded, IndexTensor({B, H, T}, slot));
    y = y.defined() ? add(y, part) : part;
  }
  if (most <= 1) return y;  // every row in at most one cluster: the sum is the mean
  Tensor inv = Tensor::empty({B, H, T, 1});
  for (size_t i = 0; i < count.size(); ++i) inv.data()[i] = count[i] > 1 ? 1.0f / static_cast<Scalar>(count[i]) : 1.0f;
  return mul(y, Var(inv));
}

Var local_shared_qk_attention(const Var& q, const Var& v, int64_t r, float p, Rng* rng, const TileCache* tiles) {
  TAPEFORMER_CHECK(q.rank() == 4 && v.shape() == q.shape() && r >= 1, "local_shared_qk_attention: q ", q.shape(),
                   " and v ", v.shape(), " must be the same (B, H, T, D), and the window ", r, " >= 1");
  const int64_t B = q.dim(0), H = q.dim(1), T = q.dim(2);
  std::vector<int32_t> pos(static_cast<size_t>(B * H * T));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(static_cast<int64_t>(i) % T);
  const IndexTensor positions({B, H, T}, std::move(pos));
  AttentionSpec spec;
  spec.causal = false;  // the band and the position mask are causal
  spec.blocks = tiles_of(tiles, *window_pattern(r), 2, T, r);
  spec.masks = {std::make_shared<PositionMask>(positions, positions, /*no_self=*/true)};
  spec.dropout_p = p;
  spec.rng = rng;
  return softmax_attention(q, q, v, spec);
}

RoutingAttention::RoutingAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng)
    : RerunsWindow("RoutingAttention", std::move(pos), cfg.n_embd, cfg.n_head, cfg.dropout),
      n_clusters(cfg.option_int("routing_clusters")),
      window(cfg.option_int("routing_window")),
      local_heads(cfg.option_int("routing_local_heads")),
      local_window(cfg.option_int("routing_local_window")),
      decay(cfg.option_number("routing_decay")) {
  if (local_heads < 0) local_heads = n_head / 2;
  // Defaults from the trained length: a call's own length must not change the layer.
  if (window == 0) window = (std::max<int64_t>(cfg.block_size, 1) + n_clusters - 1) / std::max<int64_t>(n_clusters, 1);
  if (local_window == 0) local_window = window;
  TAPEFORMER_CHECK(n_clusters >= 1 && window >= 0 && local_heads <= n_head && local_window >= 0 && decay >= 0 &&
                       decay <= 1,
                   "model.routing_clusters must be >= 1, model.routing_window and model.routing_local_window >= 0, "
                   "model.routing_local_heads <= model.n_head and model.routing_decay in [0, 1]");
  init_projections(cfg.bias, residual_init_std(cfg), rng, Projection::shared_qk);
  const int64_t D = n_embd / n_head, routed = n_head - local_heads;
  Tensor mu = Tensor::empty({routed, n_clusters, D});  // random unit centroids from the init stream
  rng.fill_normal(mu, 0.0f, 1.0f);
  centroids = register_buffer("centroids", unit_rows(mu));
  sums = register_statistic("sums", {routed, n_clusters, D + 1});
}

int64_t RoutingAttention::window_for(int64_t T) const { return std::min(T, window); }

Var RoutingAttention::forward(const Var& x, Rng& rng) const {
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, "RoutingAttention: input ", x.shape(), " must be (B, T, ",
                   n_embd, ")");
  const int64_t T = x.dim(1), H = n_head, D = n_embd / n_head, w = window_for(T);
  const float p = live_dropout();
  const std::vector<Var> h = heads(x);  // the shared q = k, and v: (B, H, T, D)
  const Var q = positional().rotate(h[0], 0), v = h[2];
  std::vector<Var> parts;
  if (local_heads > 0)
    parts.push_back(local_shared_qk_attention(slice(q, 1, 0, local_heads), slice(v, 1, 0, local_heads),
                                              local_window, p, &rng, &tiles_));
  if (local_heads < H) {
    const Var qr = slice(q, 1, local_heads, H);
    const Tensor unit = unit_rows(qr.value());  // (B, H_r, T, D)
    const IndexTensor clusters = routing_clusters(unit, centroids, w);
    parts.push_back(routed_attention(qr, slice(v, 1, local_heads, H), clusters, w, p, &rng, &tiles_));
    if (is_training() && records_gradient() && !recomputing()) {  // this batch's share of the centroids' update, once
      const int64_t B = x.dim(0), Hr = H - local_heads, n = clusters.shape[2];
      Tensor acc = sums;
      parallel::parallel_for(Hr, 1, [&](int64_t h0, int64_t h1) {
        for (int64_t hr = h0; hr < h1; ++hr)
          for (int64_t b = 0; b < B; ++b)
            for (int64_t r = 0; r < n; ++r) {
              const int64_t t = clusters.data[static_cast<size_t>((b * Hr + hr) * n + r)];
              Scalar* s = acc.data() + (hr * n_clusters + r / w) * (D + 1);
              const Scalar* u = unit.data() + ((b * Hr + hr) * T + t) * D;
              for (int64_t d = 0; d < D; ++d) s[d] += u[d];
              s[D] += 1;
            }
      });
    }
  }
  const Var y = parts.size() == 1 ? parts[0] : concat(parts, 1);  // (B, H, T, D)
  return output(y, rng);                                           // (B, T, C)
}

bool RoutingAttention::after_optimizer_step(int64_t) {
  const int64_t D = n_embd / n_head, centres = centroids.numel() / std::max<int64_t>(D, 1);
  bool moved = false;
  Tensor mu = centroids, acc = sums;
  for (int64_t c = 0; c < centres; ++c) {
    const Scalar* s = acc.data() + c * (D + 1);
    double norm = 0;
    for (int64_t d = 0; d < D; ++d) norm += static_cast<double>(s[d]) * s[d];
    if (s[D] == 0 || norm == 0 || decay == 1) continue;  // no token chose it: it keeps its place
    Scalar* m = mu.data() + c * D;
    double next_norm = 0;
    std::vector<double> next(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) {
      next[static_cast<size_t>(d)] = decay * m[d] + (1 - decay) * s[d] / std::sqrt(norm);
      next_norm += next[static_cast<size_t>(d)] * next[static_cast<size_t>(d)];
    }
    if (next_norm == 0) continue;
    for (int64_t d = 0; d < D; ++d) m[d] = static_cast<Scalar>(next[static_cast<size_t>(d)] / std::sqrt(next_norm));
    moved = true;
  }
  acc.fill(0);
  return moved;
}

// ---- the registry entry ---------------------------------------------------------

AttentionKind routing_attention_kind() {
  AttentionKind kind;
  kind.name = "routing";
  kind.summary = "Routing Transformer attention (Roy et al. 2021): shared-QK queries routed by online k-means (centroids "
                 "moved by an EMA after each step, in the checkpoint), each centroid attending causally among the w "
                 "tokens nearest it; half the heads local; generates by re-running the window";
  kind.options = {{"routing_clusters", int64_t{4}, "routing: C, centroids per routed head", int64_t{2}},
                  {"routing_window", int64_t{0}, "routing: w, tokens per centroid (0: ceil(model.block_size / C))"},
                  {"routing_local_heads", int64_t{-1}, "routing: heads attending locally (-1: half of model.n_head)"},
                  {"routing_local_window", int64_t{0}, "routing: the local heads' window (0: w)"},
                  {"routing_decay", 0.999, "routing: lambda, the centroids' moving-average decay (1: frozen)"}};
  kind.make = [](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
    return std::make_shared<RoutingAttention>(cfg, std::move(pos), rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    return ProjectedAttention::projection_parameters(cfg, ProjectedAttention::Projection::shared_qk);
  };
  kind.check = [](const ModelConfig& cfg, const PositionalKind& pos) {
    const int64_t local = cfg.option_int("routing_local_heads");
    TAPEFORMER_CHECK(cfg.option_int("routing_clusters") >= 1, "model.routing_clusters must be >= 1, got ",
                     cfg.option_int("routing_clusters"));
    TAPEFORMER_CHECK(cfg.option_int("routing_window") >= 0 && cfg.option_int("routing_local_window") >= 0,
                     "model.routing_window and model.routing_local_window must be >= 0 (0: the default)");
    TAPEFORMER_CHECK(local >= -1 && local <= cfg.n_head, "model.routing_local_heads must be in [0, model.n_head = ",
                     cfg.n_head, "] (or -1: half), got ", local);
    const double decay = cfg.option_number("routing_decay");
    TAPEFORMER_CHECK(decay >= 0 && decay <= 1, "model.routing_decay must be in [0, 1], got ", decay);
    refuse_pair_terms(pos, PairTerms::scores, "routing",
                      "its score terms follow positions, and routed attention runs its rows in cluster order");
    // The reversible stack recomputes a block's input from its output in the
    // backward: a float's difference could move a token between clusters.
    TAPEFORMER_CHECK(cfg.block != "reversible", "model.attention \"routing\" does not combine with model.block "
                     "\"reversible\": the backward's recomputed inputs could route tokens to other clusters than the "
                     "forward did");
  };
  kind.causality = Causality::chunk_dependent;
  return kind;
}

}  // namespace tapeformer
