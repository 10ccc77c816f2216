#include "tapeformer/layers/attention/sparse.h"

#include <algorithm>
#include <mutex>
#include <set>

#include "tapeformer/core/error.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/layers/attention/softmax.h"

namespace tapeformer {

AttentionKind softmax_attention_kind();  // softmax.cpp: the projections the sparse kinds share

std::shared_ptr<const kernels::BlockMask> tile_pattern(const SparsePattern& p, int64_t Tq, int64_t Tk, int64_t q0,
                                                           int64_t k0) {
  constexpr int64_t kT = kernels::kAttentionTile;
  auto out = std::make_shared<kernels::BlockMask>(Tq, Tk);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::vector<uint8_t> mask(static_cast<size_t>(kT * kT));
  for (int64_t t = 0; t < out->q_tiles(); ++t) {
    const int64_t i0 = t * kT, rows = std::min(kT, Tq - i0);
    ranges.clear();
    p.candidates(q0 + i0, q0 + i0 + rows, ranges);
    std::set<int64_t> key_tiles;  // ascending, each once
    for (const auto& [lo, hi] : ranges) {
      const int64_t a = std::max<int64_t>(lo - k0, 0), b = std::min<int64_t>(hi - k0, Tk);
      for (int64_t u = a / kT; a < b && u <= (b - 1) / kT; ++u) key_tiles.insert(u);
    }
    for (const int64_t u : key_tiles) {
      const int64_t j0 = u * kT, cols = std::min(kT, Tk - j0);
      int64_t seen = 0;
      std::fill(mask.begin(), mask.end(), uint8_t{0});
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          if (p.sees(q0 + i0 + r, k0 + j0 + c)) mask[static_cast<size_t>(r * kT + c)] = 1, ++seen;
      if (seen == 0) continue;
      out->add(static_cast<int32_t>(u), seen == rows * cols ? nullptr : mask.data());
    }
    out->end_row();
  }
  out->finish();
  return out;
}

Var sparse_attention(const SparsePattern& p, const Var& q, const Var& k, const Var& v, const std::vector<Tensor>& bias,
                     int64_t q0, int64_t k0, float dropout_p, Rng* rng, const TileSource& tiles) {
  const auto groups = p.head_groups();
  const int64_t H = q.dim(1), Tq = q.dim(2), Tk = k.dim(2), G = groups.empty() ? 1 : static_cast<int64_t>(groups.size());
  TAPEFORMER_CHECK(H % G == 0, "sparse attention: the pattern splits heads into ", G, " groups, but there are ", H,
                   " heads (model.n_head must be a multiple of ", G, ")");
  const bool self = Tq == Tk && q0 == k0;
  std::vector<AttentionHeadGroup> heads;
  for (int64_t g = 0; g < G; ++g) {
    const SparsePattern& pg = groups.empty() ? p : *groups[static_cast<size_t>(g)];
    const int64_t h0 = g * H / G, h1 = (g + 1) * H / G;
    if (self && pg.period() > 0) {
      heads.push_back({h0, h1, nullptr, pg.period()});
    } else {
      heads.push_back({h0, h1, tiles(g, pg), 0});
    }
  }
  AttentionSpec spec;
  spec.bias = bias;
  spec.groups = std::move(heads);
  spec.dropout_p = dropout_p;
  spec.rng = rng;
  return softmax_attention(q, k, v, spec);
}

namespace {

// ---- the patterns (all causal: j <= i) -------------------------------------------

// Keys i - w < j <= i.
class Window : public SparsePattern {
 public:
  explicit Window(int64_t w) : w_(w) {}
  bool sees(int64_t i, int64_t j) const override { return j <= i && i - j < w_; }
  void candidates(int64_t i0, int64_t i1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    r.push_back({i0 - w_ + 1, i1});
  }

 private:
  int64_t w_;
};

// Child et al.'s second strided head: keys a multiple of l back. Scattered
// over every tile in position order; in self-attention each residue class
// runs as its own causal sequence (period()).
class Residue : public SparsePattern {
 public:
  explicit Residue(int64_t l) : l_(l) {}
  bool sees(int64_t i, int64_t j) const override { return j <= i && (i - j) % l_ == 0; }
  void candidates(int64_t i0, int64_t i1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    r.push_back({0, i1});  // (position order: every earlier tile may hold some)
  }
  int64_t period() const override { return l_; }

 private:
  int64_t l_;
};

// Child et al.'s strided pattern with its two parts on two halves of the heads.
class Strided : public SparsePattern {
 public:
  explicit Strided(int64_t l) : window_(std::make_shared<Window>(l)), residue_(std::make_shared<Residue>(l)) {}
  bool sees(int64_t i, int64_t j) const override { return window_->sees(i, j) || residue_->sees(i, j); }
  void candidates(int64_t i0, int64_t i1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    residue_->candidates(i0, i1, r);
  }
  std::vector<std::shared_ptr<const SparsePattern>> head_groups() const override { return {window_, residue_}; }

 private:
  std::shared_ptr<const SparsePattern> window_, residue_;
};

// Child et al.'s fixed pattern: the query's own block, and the last `c`
// ("summary") positions of every block.
class Fixed : public SparsePattern {
 public:
  Fixed(int64_t l, int64_t c) : l_(l), c_(c) {}
  bool sees(int64_t i, int64_t j) const override { return j <= i && (j / l_ == i / l_ || j % l_ >= l_ - c_); }
  void candidates(int64_t i0, int64_t i1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    r.push_back({i0 / l_ * l_, i1});
    for (int64_t b = 0; b < i0 / l_; ++b) r.push_back({b * l_ + l_ - c_, b * l_ + l_});
  }

 private:
  int64_t l_, c_;
};

// The first g positions are global: they see every earlier key and every
// later query sees them.
struct Global {
  int64_t g;
  bool sees(int64_t i, int64_t j) const { return j < g || i < g; }
  void candidates(int64_t i0, int64_t i1, std::vector<std::pair<int64_t, int64_t>>& r) const {
    if (g == 0) return;
    r.push_back({0, std::min(g, i1)});
    if (i0 < g) r.push_back({0, i1});
  }
};

// Longformer: a dilated window and global tokens.
class Longformer : public SparsePattern {
 public:
  Longformer(int64_t w, int64_t d, int64_t g) : w_(w), d_(d), global_{g} {}
  bool sees(int64_t i, int64_t j) const override {
    return j <= i && (((i - j) % d_ == 0 && (i - j) / d_ < w_) || global_.sees(i, j));
  }
  void candidates(int64_t i0, int64_t i1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    r.push_back({i0 - (w_ - 1) * d_, i1});
    global_.candidates(i0, i1, r);
  }

 private:
  int64_t w_, d_;
  Global global_;
};

// BigBird: a window, global tokens, and `r` random earlier blocks of keys per
// block of queries (a hash of the seed and the query block, so every
// layer, shard and run draws the same).
class BigBird : public SparsePattern {
 public:
  BigBird(int64_t w, int64_t g, int64_t r, int64_t l, int64_t seed) : w_(w), r_(r), l_(l), seed_(seed), global_{g} {}
  bool sees(int64_t i, int64_t j) const override {
    if (j > i) return false;
    if (i - j < w_ || global_.sees(i, j)) return true;
    const std::lock_guard<std::mutex> lock(mutex_);
    while (static_cast<int64_t>(memo_.size()) <= i / l_) memo_.push_back(random_blocks(static_cast<int64_t>(memo_.size())));
    const std::vector<int64_t>& blocks = memo_[static_cast<size_t>(i / l_)];
    return std::binary_search(blocks.begin(), blocks.end(), j / l_);
  }
  void candidates(int64_t i0, int64_t i1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    r.push_back({i0 - w_ + 1, i1});
    global_.candidates(i0, i1, r);
    for (int64_t qb = i0 / l_; qb <= (i1 - 1) / l_; ++qb)
      for (int64_t kb : random_blocks(qb)) r.push_back({kb * l_, kb * l_ + l_});
  }
  // Ascending: min(r, qb) distinct blocks below qb.
  std::vector<int64_t> random_blocks(int64_t qb) const {
    std::vector<int64_t> all(static_cast<size_t>(qb));
    for (int64_t b = 0; b < qb; ++b) all[static_cast<size_t>(b)] = b;
    Rng rng(static_cast<uint64_t>(seed_) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(qb));
    const int64_t n = std::min(r_, qb);
    for (int64_t k = 0; k < n; ++k)  // partial Fisher-Yates
      std::swap(all[static_cast<size_t>(k)], all[static_cast<size_t>(k + static_cast<int64_t>(rng.below(qb - k)))]);
    all.resize(static_cast<size_t>(n));
    std::sort(all.begin(), all.end());
    return all;
  }

 private:
  int64_t w_, r_, l_, seed_;
  Global global_;
  mutable std::mutex mutex_;
  mutable std::vector<std::vector<int64_t>> memo_;  // random_blocks(qb) for qb < size
};

const ModelOption kWindow{"window", int64_t{64}, "keys a query sees back, itself included (window, longformer, bigbird)", int64_t{3}};
const ModelOption kStride{"stride", int64_t{64}, "strided: l, the window of one half of the heads and the stride of the other", int64_t{3}};
const ModelOption kBlock{"sparse_block", int64_t{64}, "block length l (fixed's blocks, bigbird's random blocks)", int64_t{4}};
const ModelOption kSummary{"summary", int64_t{8}, "fixed: the last c positions of each block every later query sees", int64_t{1}};
const ModelOption kDilation{"dilation", int64_t{1}, "longformer: the window's stride", int64_t{2}};
const ModelOption kGlobal{"global_tokens", int64_t{8}, "longformer, bigbird: the first positions, seen by and seeing all", int64_t{2}};
const ModelOption kRandom{"random_blocks", int64_t{2}, "bigbird: random earlier key blocks per query block", int64_t{1}};
const ModelOption kSeed{"sparse_seed", int64_t{0}, "bigbird: seed of the random blocks"};

}  // namespace

SparsePatternKind image_1d_pattern_kind();  // image_local.cpp
SparsePatternKind image_2d_pattern_kind();  // image_local.cpp

int64_t positive_option(const ModelConfig& cfg, const char* name, int64_t min) {
  const int64_t v = cfg.option_int(name);
  TAPEFORMER_CHECK(v >= min, "model.", name, " must be >= ", min, ", got ", v);
  return v;
}

std::shared_ptr<const SparsePattern> window_pattern(int64_t w) { return std::make_shared<Window>(w); }

Registry<SparsePatternKind>& sparse_pattern_kinds() {
  static Registry<SparsePatternKind> kinds(
      "model.attention",
      {{"window", "local attention: the last model.window positions", {kWindow},
        [](const ModelConfig& c) { return std::make_shared<Window>(positive_option(c, "window")); }},
       {"strided", "Child et al.'s strided pattern: half the heads see the last model.stride positions, half every "
                   "model.stride-th",
        {kStride},
        [](const ModelConfig& c) { return std::make_shared<Strided>(positive_option(c, "stride")); }},
       {"fixed", "Child et al.'s fixed pattern: own block of model.sparse_block, and each block's last model.summary",
        {kBlock, kSummary},
        [](const ModelConfig& c) -> std::shared_ptr<const SparsePattern> {
          const int64_t l = positive_option(c, "sparse_block"), s = positive_option(c, "summary");
          TAPEFORMER_CHECK(s <= l, "model.summary (", s, ") must be at most model.sparse_block (", l, ")");
          return std::make_shared<Fixed>(l, s);
        }},
       {"longformer", "Longformer: a window of model.window keys model.dilation apart, and model.global_tokens",
        {kWindow, kDilation, kGlobal},
        [](const ModelConfig& c) {
          return std::make_shared<Longformer>(positive_option(c, "window"), positive_option(c, "dilation"),
                                              positive_option(c, "global_tokens", 0));
        }},
       {"bigbird", "BigBird: window, global tokens and model.random_blocks random earlier blocks per query block",
        {kWindow, kGlobal, kRandom, kBlock, kSeed},
        [](const ModelConfig& c) {
          return std::make_shared<BigBird>(positive_option(c, "window"), positive_option(c, "global_tokens", 0),
                                           positive_option(c, "random_blocks", 0), positive_option(c, "sparse_block"),
                                           positive_option(c, "sparse_seed", 0));
        }},
       image_1d_pattern_kind(), image_2d_pattern_kind()});
  return kinds;
}

AttentionKind sparse_attention_kind(const SparsePatternKind& pattern) {
  AttentionKind kind;
  kind.name = pattern.name;
  kind.summary = pattern.summary + " (block-sparse softmax attention: only the pattern's tiles are computed; "
                 "generates with a KV cache)";
  kind.options = pattern.options;
  const std::string name = pattern.name;
  kind.make = [name](const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
    return std::make_shared<MultiHeadAttention>(cfg.n_embd, cfg.n_head, cfg.bias, cfg.dropout, residual_init_std(cfg),
                                                rng, std::move(pos), sparse_pattern_kinds().get(name).make(cfg));
  };
  kind.parameters = softmax_attention_kind().parameters;  // the same projections
  kind.check = [name](const ModelConfig& cfg, const PositionalKind& pos) {
    refuse_pair_terms(pos, PairTerms::learned, name,
                      "its learned per-pair terms need the T x T scores, which sparse attention never forms");
    const auto pattern = sparse_pattern_kinds().get(name).make(cfg);  // the options' values
    const auto groups = pattern->head_groups();
    TAPEFORMER_CHECK(groups.empty() || cfg.n_head % static_cast<int64_t>(groups.size()) == 0, "model.attention \"",
                     name, "\" splits the heads into ", groups.size(), " groups: model.n_head (", cfg.n_head,
                     ") must be a multiple of ", groups.size());
  };
  return kind;
}

}  // namespace tapeformer
