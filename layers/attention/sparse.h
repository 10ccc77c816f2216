// Sparse attention patterns (docs/math.md#sparse-patterns): softmax attention where query i sees
// only the keys a pattern lists: the pattern is the attention kernel's block
// mask (softmax_attention, autograd/ops.h), so only the 64 x 64 tiles it
// needs are computed, forward and backward. A pattern is a predicate over
// absolute positions plus the key ranges worth testing; tile_pattern turns
// it into the block mask's tile list and partial-tile masks. Every pattern here is
// causal (j <= i), so each is an attention kind of a causal LM:
//
//   model.attention   query i sees key j <= i when
//   "window"          i - j < window                                   (local attention)
//   "strided"         half the heads: i - j < stride; the other half: (i - j) % stride == 0
//                                                                     (Child et al. 2019, heads split)
//   "fixed"           j / block == i / block, or j % block >= block - summary   (Child et al. 2019)
//   "longformer"      (i - j) % dilation == 0 and (i - j) / dilation < window, or j < global, or i < global
//   "bigbird"         i - j < window, or j < global, or i < global, or block j / block is one of
//                     random_blocks earlier blocks drawn for block i / block (Zaheer et al. 2020)
//   "image_1d", "image_2d"  the Image Transformer's local blocks over an image's raster order
//                     (Parmar et al. 2018; image_local.cpp)
//
// with window = model.window, stride = model.stride, block = model.sparse_block, summary =
// model.summary, dilation = model.dilation, global = model.global_tokens,
// random_blocks = model.random_blocks (BigBird's draw is a hash of
// model.sparse_seed and the query block: the same in every layer, and saved
// with the config in checkpoints). Global tokens are the first positions
// (the causal form of Longformer's symmetric global attention: they see
// every earlier key, and every later query sees them).
//
//   auto p = sparse_pattern_kinds().get("window").make(cfg);
//   std::shared_ptr<const kernels::BlockMask> tiles = tile_pattern(*p, Tq, Tk, q0, k0);
//   AttentionSpec spec;  spec.blocks = tiles;
//   Var y = softmax_attention(q, k, v, spec);            // q (B, H, Tq, D) at positions q0..
//
// A new pattern is an entry in sparse_pattern_kinds(): it becomes an
// attention kind of the same name, with the softmax layer's projections,
// positional schemes (not Shaw's or Transformer-XL's per-pair terms) and KV
// cache.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tapeformer/core/kernels/flash_attention.h"
#include "tapeformer/core/registry.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/tile_cache.h"

namespace tapeformer {

class SparsePattern {
 public:
  virtual ~SparsePattern() = default;
  // Whether the query at absolute position i sees the key at position j.
  virtual bool sees(int64_t i, int64_t j) const = 0;
  // Appends key ranges [lo, hi) that cover every key some query in [i0, i1)
  // sees (a superset is fine: only the tiles they touch are tested).
  virtual void candidates(int64_t i0, int64_t i1, std::vector<std::pair<int64_t, int64_t>>& ranges) const = 0;

  // Heads in groups with patterns of their own: heads [g H / G, (g + 1) H / G)
  // use head_groups()[g]. Empty (the default): every head uses this pattern.
  virtual std::vector<std::shared_ptr<const SparsePattern>> head_groups() const { return {}; }
  // > 0: the pattern is exactly "j <= i and (i - j) % period() == 0"
  // (strided's second head). Self-attention then runs each residue class as
  // a causal sequence read in place through strided views: no tiles, no
  // copies (AttentionSpec::groups). A query block of other lengths (a KV
  // cache step) uses the tiles. 0 (the default): always the tiles.
  virtual int64_t period() const { return 0; }
};

// The kernel's tiles for queries at positions q0 + [0, Tq) over keys at
// k0 + [0, Tk): every tile with a visible pair, masked where not all are.
std::shared_ptr<const kernels::BlockMask> tile_pattern(const SparsePattern& p, int64_t Tq, int64_t Tk, int64_t q0,
                                                           int64_t k0);

// Attention of q (B, H, Tq, D) at positions q0.. over k, v (B, H, Tk, D) at
// k0.. through pattern p (each head group with its own pattern), causal ->
// (B, H, Tq, D), in one softmax_attention with head groups. `tiles(group, p)` supplies
// (and may cache) the tiles of a group's pattern.
using TileSource = std::function<std::shared_ptr<const kernels::BlockMask>(int64_t group, const SparsePattern& p)>;
Var sparse_attention(const SparsePattern& p, const Var& q, const Var& k, const Var& v, const std::vector<Tensor>& bias,
                     int64_t q0, int64_t k0, float dropout_p, Rng* rng, const TileSource& tiles);

struct SparsePatternKind {
  std::string name;
  std::string summary;               // one line, for docs
  std::vector<ModelOption> options;  // the model.* keys it reads
  std::function<std::shared_ptr<const SparsePattern>(const ModelConfig&)> make;  // Error naming a bad option
};

// Kinds: the table in sparse.cpp (`tapeformer kinds` lists them). Key: model.attention.

// The local window: keys i - w < j <= i (the "window" kind's pattern).
std::shared_ptr<const SparsePattern> window_pattern(int64_t w);
// model.<name> as an integer, Error naming the key unless it is >= min (a
// pattern kind's options).
int64_t positive_option(const ModelConfig& cfg, const char* name, int64_t min = 1);
Registry<SparsePatternKind>& sparse_pattern_kinds();

// The attention kind of a pattern kind (layers/attention/registry.cpp lists
// one per entry of sparse_pattern_kinds()).
AttentionKind sparse_attention_kind(const SparsePatternKind& pattern);

}  // namespace tapeformer
