// Routing attention (Roy et al. 2021, the Routing Transformer), the
// "routing" attention kind: online k-means routes each query to the keys of
// its cluster. Queries and keys are shared (k = q, as in the reference code
// for self-attention), so a token and its key always share a cluster.
//
//   q = k = x W_qk, v = x W_v                          (B, H, T, D)
//   q^ = q / |q|;  s_tc = q^_t . mu_c                  mu (H_r, C, D) unit centroids per routed head
//   balanced routing: centroid c takes the w tokens of highest s_tc (w = ceil(block_size / C), at most T),
//                     re-sorted by position
//   inside a cluster: softmax_{j <= i}(q_i . k_j / sqrt(D)) v_j, a token's own key only when it sees no other
//   y_t = mean over the clusters that took t (0 when none did)
//   local heads: the same scores over the window i - r < j <= i
//
// The first model.routing_local_heads heads (default H / 2) attend locally
// in a window of model.routing_local_window positions (default
// ceil(block_size / C)); the others route through model.routing_clusters =
// C centroids. model.routing_window = w overrides ceil(block_size / C) (with
// C = 1 and no override, w covers every position: full causal attention).
// Both follow the trained length, not the length of a call, so a shorter
// prompt runs the layer as it trained.
//
// The centroids are a buffer (in the checkpoint), moved by an exponential
// moving average after each optimizer step: m_c = normalise(sum of the q^_t
// routed to c over the step's batches), mu_c <- normalise(lambda mu_c +
// (1 - lambda) m_c), lambda = model.routing_decay (0.999; 1 freezes the
// random initial centroids); a centroid no token chose keeps its place.
// The sums are a batch statistic (Module::statistics): every data-parallel
// shard and rank adds its own, summed in the shard tree before the update,
// so N ranks x S shards give the bits of one process with N S shards (other
// shard counts differ by rounding, as the gradients do). No gradient flows
// through the assignment.
//
// Balanced routing is causal only per sequence, as LSH is: no value after a
// query's position is read, but whether a token is among a centroid's top w
// depends on the later tokens (Causality::chunk_dependent); the gradient of
// an output with respect to every later input is exactly zero
// (tests/layers/test_routing.cpp). Generation re-runs the whole window
// (RerunsWindow), since which tokens a centroid takes depends on all of it,
// so each next token is the full forward's.
#pragma once

#include <memory>
#include <vector>

#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/input_window.h"
#include "tapeformer/layers/attention/projected.h"
#include "tapeformer/layers/attention/tile_cache.h"

namespace tapeformer {

// Which rows each centroid routes: for q^ (B, H, T, D) unit rows and
// centroids mu (H, C, D), each centroid's w rows of highest similarity in
// position order, (B, H, C w); ties go to the earlier position.
IndexTensor routing_clusters(const Tensor& unit_q, const Tensor& mu, int64_t w);

// Attention inside clusters: q, v (B, H, T, D) (keys are q), clusters from
// routing_clusters (B, H, C w), w rows each -> (B, H, T, D), each row the
// mean of its clusters' outputs (0 in none). dropout p on the weights.
Var routed_attention(const Var& q, const Var& v, const IndexTensor& clusters, int64_t w, float p, Rng* rng,
                     const TileCache* tiles = nullptr);

// Shared-QK causal attention in a window of r positions: q, v (B, H, T, D)
// -> (B, H, T, D); a token's own key only when it sees no other.
Var local_shared_qk_attention(const Var& q, const Var& v, int64_t r, float p, Rng* rng,
                              const TileCache* tiles = nullptr);

class RoutingAttention : public RerunsWindow {
 public:
  RoutingAttention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng);
  using RerunsWindow::forward;
  Var forward(const Var& x, Rng& rng) const override;  // (B, T, C) -> (B, T, C)

  int64_t window_for(int64_t T) const;  // w for a sequence of T positions: min(T, w)

  int64_t n_clusters, window, local_heads, local_window;  // C, w, heads [0, local_heads) local, r (from the config)
  double decay;                                           // lambda
  Tensor centroids;  // (H - local_heads, C, D), unit rows (buffer "centroids")
  Tensor sums;       // (H - local_heads, C, D + 1): sum of routed q^ and their count (statistic "sums")

 protected:
  bool after_optimizer_step(int64_t step) override;  // the EMA of the centroids (returns whether they moved)

 private:
  TileCache tiles_;
};

}  // namespace tapeformer
