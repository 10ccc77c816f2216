// The table of block kinds.
#include "tapeformer/layers/block/block.h"

#include <algorithm>
#include <string>
#include <utility>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"

namespace tapeformer {

// Each kind's entry, defined in its own file.
BlockKind standard_block_kind();    // standard.cpp
BlockKind reversible_block_kind();  // reversible.cpp
BlockKind post_ln_block_kind();     // post_ln.cpp
BlockKind gtrxl_block_kind();       // gtrxl.cpp

Registry<BlockKind>& block_kinds() {
  static Registry<BlockKind> kinds("model.block", {standard_block_kind(), reversible_block_kind(), post_ln_block_kind(),
                                                 gtrxl_block_kind()});
  return kinds;
}

Var BlockStack::forward(const Var&, SegmentMemory&, Rng&) const {
  fail("this block stack keeps no segment memory (model.mem_len needs model.block \"standard\", \"post_ln\" or "
       "\"gtrxl\")");
}

std::vector<MemoryGroupSpec> memory_groups(const ModelConfig& cfg) {
  bool carries = false;
  for (const ModelOption& o : block_kinds().get(cfg.block).options) carries = carries || o.name == "mem_len";
  if (!carries || cfg.option_int("mem_len") <= 0) return {};
  const int64_t C = cfg.n_embd;
  // Format 1 held the segment memory alone; the compressed rows' group is there since format 2, empty
  // without compression (none fell into it).
  std::vector<MemoryGroupSpec> groups{{"layers", cfg.n_layer, cfg.option_int("mem_len"), C, "segment memory", 1},
                                      {"compressed", cfg.n_layer, MemoryCompression::of(cfg).len, C, "compressed memory", 2}};
  const Memorizing m = Memorizing::of(cfg);
  if (m.len > 0) groups.push_back({"external", 2, m.len, C, "external memory", 2});
  return groups;
}

Tensor next_memory(const Tensor& old, const Var& x, int64_t mem_len) {
  const Tensor cat = old.defined() && old.dim(1) > 0 ? concat({Var(old), detach(x)}, 1).value() : x.value();
  const int64_t n = cat.dim(1), keep = std::min(n, mem_len);
  return cat.slice(1, n - keep, n).contiguous();  // (B, keep, C)
}

MemoryCompression MemoryCompression::of(const ModelConfig& cfg) {
  MemoryCompression c;
  for (const ModelOption& o : block_kinds().get(cfg.block).options)
    if (o.name == "cmem_len") c = {cfg.option_int("cmem_len"), cfg.option_int("cmem_ratio"), cfg.option_string("cmem_fn")};
  return c;
}

Memorizing Memorizing::of(const ModelConfig& cfg) {
  Memorizing m;
  for (const ModelOption& o : block_kinds().get(cfg.block).options)
    if (o.name == "xmem_len") m = {cfg.option_int("xmem_len"), cfg.option_int("xmem_layer"), cfg.option_int("xmem_topk"),
           cfg.option_number("xmem_gate_bias")};
  if (m.layer < 0) m.layer = std::max<int64_t>(0, cfg.n_layer - 2);
  return m;
}

Tensor compress_rows(const Tensor& rows_in, const MemoryCompression& c) {
  const Tensor rows = rows_in.contiguous();
  const int64_t B = rows.dim(0), n = rows.dim(1), C = rows.dim(2), r = c.ratio, out_n = n / r, skip = n - out_n * r;
  Tensor out = Tensor::empty({B, out_n, C});
  const bool max = c.fn == "max";
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t k = 0; k < out_n; ++k) {
      const Scalar* in = rows.data() + (b * n + skip + k * r) * C;
      Scalar* o = out.data() + (b * out_n + k) * C;
      for (int64_t j = 0; j < C; ++j) o[j] = in[j];
      for (int64_t i = 1; i < r; ++i)
        for (int64_t j = 0; j < C; ++j) o[j] = max ? std::max(o[j], in[i * C + j]) : o[j] + in[i * C + j];
      if (!max)
        for (int64_t j = 0; j < C; ++j) o[j] /= static_cast<Scalar>(r);
    }
  }
  return out;
}

Tensor attended_memory(const Tensor& memory, const Tensor& compressed) {
  if (!compressed.defined() || compressed.dim(1) == 0) return memory;
  if (!memory.defined() || memory.dim(1) == 0) return compressed;
  return concat({Var(compressed), Var(memory)}, 1).value();
}

Tensor evict_rows(Tensor& memory, const Var& x, int64_t mem_len) {
  const Tensor old = memory;
  memory = next_memory(old, x, mem_len);
  const int64_t before = old.defined() ? old.dim(1) : 0, fell_out = before + x.dim(1) - memory.dim(1);
  if (fell_out <= 0) return Tensor();
  // The rows that fell out are the oldest of [old; x].
  const Tensor all = before > 0 ? concat({Var(old), detach(x)}, 1).value() : x.value();
  return all.slice(1, 0, fell_out).contiguous();  // (B, F, C)
}

void append_compressed(Tensor& compressed, const Tensor& rows, int64_t len) {
  if (!rows.defined() || rows.dim(1) == 0) return;
  const Tensor grown = attended_memory(rows, compressed);  // [compressed; rows]
  const int64_t m = grown.dim(1), kept = std::min(m, len);
  compressed = grown.slice(1, m - kept, m).contiguous();
}

namespace {
// One layer's convolution, W [cC, C] and b [C], as a child module "L".
class ConvWeights : public Module {
 public:
  ConvWeights(Tensor w, Tensor b) {
    weight = register_parameter("weight", std::move(w));
    bias = register_parameter("bias", std::move(b));
  }
  Var weight, bias;
};
}  // namespace

ConvCompression::ConvCompression(int64_t n_layer, int64_t n_embd, int64_t ratio_) : ratio(ratio_) {
  TAPEFORMER_CHECK(n_layer >= 1 && n_embd >= 1 && ratio >= 1, "ConvCompression: n_layer ", n_layer, ", n_embd ",
                   n_embd, " and ratio ", ratio, " must be positive");
  for (int64_t l = 0; l < n_layer; ++l) {
    Tensor w = Tensor::zeros({ratio * n_embd, n_embd});  // W_i = I / c stacked: the mean of the c rows
    for (int64_t i = 0; i < ratio; ++i)
      for (int64_t j = 0; j < n_embd; ++j) w.data()[(i * n_embd + j) * n_embd + j] = 1.0f / static_cast<float>(ratio);
    const auto layer = register_module(std::to_string(l), std::make_shared<ConvWeights>(w, Tensor::zeros({n_embd})));
    weights.push_back(layer->weight);
    biases.push_back(layer->bias);
  }
}

Var ConvCompression::forward(size_t layer, const Var& rows) const {
  TAPEFORMER_CHECK(layer < weights.size(), "ConvCompression: layer ", layer, " of ", weights.size());
  const int64_t C = weights[layer].dim(1);
  TAPEFORMER_CHECK(rows.rank() == 3 && rows.dim(2) == C && rows.dim(1) % ratio == 0, "ConvCompression: rows ",
                   rows.shape(), " must be (B, n, ", C, ") with n a multiple of ", ratio);
  const Var groups = reshape(rows, {rows.dim(0), rows.dim(1) / ratio, ratio * C});  // (B, n/c, cC)
  return linear(groups, weights[layer], biases[layer]);                             // (B, n/c, C)
}

double ConvCompression::parameters(const ModelConfig& cfg) {
  const MemoryCompression c = MemoryCompression::of(cfg);
  if (!c.learned()) return 0;
  const double C = static_cast<double>(cfg.n_embd);
  return static_cast<double>(cfg.n_layer) * (static_cast<double>(c.ratio) * C * C + C);
}

Var reconstruction_loss(const std::function<Var(const Var&)>& attend, const Tensor& old, const Var& compressed) {
  const Var target = detach(attend(Var(old)));  // (B, T, C), a constant
  const Var diff = sub(attend(compressed), target);
  return mean(mul(diff, diff));
}

}  // namespace tapeformer
