#include "tapeformer/layers/memory/compressive.h"

#include <algorithm>
#include <cmath>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/memory/memory.h"

namespace tapeformer {

MemoryCompression MemoryCompression::of(const ModelConfig& cfg) {
  MemoryCompression c;
  if (block_kinds().get(cfg.block).memory)
    c = {cfg.option_int("cmem_len"), cfg.option_int("cmem_ratio"), cfg.option_string("cmem_fn")};
  return c;
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

namespace {

constexpr const char* kGroup = "compressed";

class CompressiveMemory : public Memory {
 public:
  CompressiveMemory(const MemoryCompression& c, int64_t layers, int64_t n_embd) : c_(c) {
    if (c_.learned()) conv_ = register_module("compress", std::make_shared<ConvCompression>(layers, n_embd, c_.ratio));
  }

  void begin_segment(SegmentMemory& state, size_t layers) const override {
    state.group(kGroup).resize(layers);
    if (conv_) conv_->set_reconstruction_loss(Var());
  }
  // [compressed; memory]
  Tensor attended(SegmentMemory& state, size_t layer, const Tensor& rows) const override {
    return attended_memory(rows, state.group(kGroup)[layer]);
  }
  bool wants_evicted() const override { return true; }
  void update(SegmentMemory& state, const MemoryLayer& layer, int64_t, MemoryCarry& carry) const override {
    const Tensor& old = carry.evicted;  // (B, F, C)
    if (!old.defined()) return;
    Tensor& compressed = state.group(kGroup)[layer.index];
    if (!conv_) {
      append_compressed(compressed, compress_rows(old, c_), c_.len);
      return;
    }
    // Whole groups of c rows only; an evaluation memory of another length may leave the oldest few over.
    const int64_t F = old.dim(1), whole = F - F % c_.ratio;
    if (whole == 0) return;
    const Tensor groups = old.slice(1, F - whole, F).contiguous();  // (B, whole, C)
    const Var pooled = conv_->forward(layer.index, Var(groups));    // (B, whole / c, C)
    if (is_training() && grad_enabled()) {
      TAPEFORMER_CHECK(static_cast<bool>(layer.content_attention), "model.cmem_fn \"conv\" needs layers with "
                       "content_attention(x, rows), which this stack's layer lacks");
      const Var loss = reconstruction_loss(layer.content_attention, groups, pooled);
      conv_->add_reconstruction_loss(loss);
    }
    append_compressed(compressed, pooled.value(), c_.len);
  }

 private:
  MemoryCompression c_;
  std::shared_ptr<ConvCompression> conv_;  // "compress": the learned compression; null otherwise
};

}  // namespace

MemoryKind compressive_memory_kind() {
  MemoryKind kind;
  kind.name = "compressive";
  kind.summary = "the Compressive Transformer's compressed memory (Rae et al. 2019): rows that fall out of the "
                 "segment memory are pooled model.cmem_ratio to one into model.cmem_len rows per layer";
  kind.options = {
      {"cmem_len", int64_t{0},
       "Compressive Transformer: compressed rows per layer; the rows that fall out of the memory are pooled "
       "model.cmem_ratio to one into it instead of dropped, and attention reads [compressed; memory; segment] (0: off)",
       OptionValue{int64_t{8}}},
      {"cmem_ratio", int64_t{2}, "Compressive Transformer: c, memory rows per compressed row"},
      {"cmem_fn", std::string("mean"),
       "Compressive Transformer: the compression, \"mean\" or \"max\" over c rows, or \"conv\": a learned 1-D "
       "convolution (kernel = stride = c) trained by the attention-reconstruction loss",
       OptionValue{std::string("conv")}}};
  kind.needs = {"xl"};
  kind.make = [](const ModelConfig& cfg, const MemoryHost& host) -> std::shared_ptr<Memory> {
    return std::make_shared<CompressiveMemory>(MemoryCompression::of(cfg), host.layers, cfg.n_embd);
  };
  // Its group is in every memory run's checkpoint since format 2, empty while it is off.
  kind.use = [](const ModelConfig& cfg, bool, MemoryUse& use) {
    if (!use.carried()) return;
    use.groups.push_back({kGroup, cfg.n_layer, cfg.option_int("cmem_len"), cfg.n_embd, "compressed memory", 2});
  };
  kind.parameters = ConvCompression::parameters;
  kind.check = [](const ModelConfig& cfg) {
    const int64_t m = cfg.option_int("mem_len"), e = cfg.option_int("ext_len");
    const MemoryCompression c = MemoryCompression::of(cfg);
    TAPEFORMER_CHECK(c.len >= 0 && c.len <= 1 << 20, "model.cmem_len must be in [0, 2^20], got ", c.len);
    TAPEFORMER_CHECK(c.ratio >= 1 && c.ratio <= 1024, "model.cmem_ratio must be in [1, 1024], got ", c.ratio);
    TAPEFORMER_CHECK(c.fn == "mean" || c.fn == "max" || c.fn == "conv",
                     "model.cmem_fn must be \"mean\", \"max\" or \"conv\", got \"", c.fn, "\"");
    if (c.len == 0) {
      TAPEFORMER_CHECK(c.ratio == 2 && c.fn == "mean", "model.cmem_ratio and model.cmem_fn apply only with a "
                       "compressed memory: set model.cmem_len > 0, or leave them at their defaults");
      return;
    }
    TAPEFORMER_CHECK(m > 0, "model.cmem_len = ", c.len,
                     " compresses what falls out of the memory: set model.mem_len > 0");
    TAPEFORMER_CHECK(e == 0, "model.cmem_len with model.ext_len = ", e, ": a compressed memory needs ext_len 0");
    TAPEFORMER_CHECK(m % c.ratio == 0 && cfg.block_size % c.ratio == 0, "model.cmem_ratio = ", c.ratio,
                     " must divide model.mem_len (", m, ") and model.block_size (", cfg.block_size,
                     "), so that whole groups of rows fall out of the memory");
  };
  return kind;
}

}  // namespace tapeformer
