#include "tapeformer/layers/memory/xl.h"

#include <algorithm>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/memory/memory.h"

namespace tapeformer {

Tensor next_memory(const Tensor& old, const Var& x, int64_t mem_len) {
  const Tensor cat = old.defined() && old.dim(1) > 0 ? concat({Var(old), detach(x)}, 1).value() : x.value();
  const int64_t n = cat.dim(1), keep = std::min(n, mem_len);
  return cat.slice(1, n - keep, n).contiguous();  // (B, keep, C)
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

namespace {

constexpr const char* kGroup = "layers";

class XlMemory : public Memory {
 public:
  XlMemory(int64_t mem_len, int64_t layers) : mem_len_(mem_len), layers_(layers) {}

  void begin_segment(SegmentMemory& state, size_t layers) const override { state.group(kGroup).resize(layers); }
  Tensor attended(SegmentMemory& state, size_t layer, const Tensor&) const override {
    return state.group(kGroup)[layer];
  }
  void update(SegmentMemory& state, const MemoryLayer& layer, int64_t keep, MemoryCarry& carry) const override {
    Tensor& rows = state.group(kGroup)[layer.index];
    const int64_t limit = state.limit > 0 ? state.limit : mem_len_;
    const Var kept = slice(layer.input, 1, 0, keep);
    if (carry.wanted) {
      carry.evicted = evict_rows(rows, kept, limit);
    } else {
      rows = next_memory(rows, kept, limit);
    }
  }

 private:
  int64_t mem_len_, layers_;
};

}  // namespace

MemoryKind xl_memory_kind() {
  MemoryKind kind;
  kind.name = "xl";
  kind.summary = "Transformer-XL's segment memory (Dai et al. 2019): each layer also attends to its inputs at the last "
                 "model.mem_len positions, carried across training steps without gradient";
  kind.options = {{"mem_len", int64_t{0},
                   "Transformer-XL memory: each layer also attends to its inputs at this many earlier positions, "
                   "carried across training steps (0: off)",
                   OptionValue{int64_t{16}}},
                  {"ext_len", int64_t{0},
                   "Transformer-XL: this many tokens before each segment are fed again with it (their loss not "
                   "counted) and kept out of the memory (docs/math.md#ext_len-and-evaluation; 0: off)"}};
  kind.make = [](const ModelConfig& cfg, const MemoryHost& host) -> std::shared_ptr<Memory> {
    return std::make_shared<XlMemory>(cfg.option_int("mem_len"), host.layers);
  };
  kind.use = [](const ModelConfig& cfg, bool on, MemoryUse& use) {
    if (!on) return;
    use.mem_len = cfg.option_int("mem_len");
    use.ext_len = cfg.option_int("ext_len");
    use.groups.push_back({kGroup, cfg.n_layer, use.mem_len, cfg.n_embd, "segment memory", 1});
  };
  kind.check = [](const ModelConfig& cfg) {
    const int64_t m = cfg.option_int("mem_len"), e = cfg.option_int("ext_len");
    TAPEFORMER_CHECK(m >= 0 && m <= 1 << 20, "model.mem_len must be in [0, 2^20], got ", m);
    TAPEFORMER_CHECK(m == 0 || attention_kinds().get(cfg.attention).segment_memory, "model.mem_len = ", m,
                     " needs an attention kind that takes a segment memory; model.attention \"", cfg.attention,
                     "\" does not");
    TAPEFORMER_CHECK(e >= 0 && e <= cfg.block_size, "model.ext_len must be in [0, model.block_size = ",
                     cfg.block_size, "], got ", e);
    TAPEFORMER_CHECK(e == 0 || m > 0, "model.ext_len = ", e, " needs a memory: set model.mem_len > 0");
    TAPEFORMER_CHECK(m == 0 || cfg.causal, "model.mem_len = ", m, " needs a causal model (ModelConfig::causal)");
  };
  return kind;
}

}  // namespace tapeformer
