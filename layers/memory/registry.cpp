// The table of memory kinds, and the state every memory keeps its tensors in.
#include "tapeformer/layers/memory/memory.h"

#include "tapeformer/layers/block/block.h"

namespace tapeformer {

// Each kind's entry, defined in its own file; the order is the order a stack runs them in.
MemoryKind xl_memory_kind();           // xl.cpp
MemoryKind compressive_memory_kind();  // compressive.cpp
MemoryKind memorizing_memory_kind();   // memorizing.cpp

Registry<MemoryKind>& memory_kinds() {
  static Registry<MemoryKind> kinds("memory",
                                    {xl_memory_kind(), compressive_memory_kind(), memorizing_memory_kind()});
  return kinds;
}

bool MemoryKind::on(const ModelConfig& cfg) const {
  if (options.empty()) return false;
  const OptionValue v = declared_value(options.front(), cfg.options, "model", options.front().default_value.index());
  if (const auto* n = std::get_if<int64_t>(&v)) return *n > 0;
  if (const auto* x = std::get_if<double>(&v)) return *x > 0;
  if (const auto* b = std::get_if<bool>(&v)) return *b;
  return false;
}

std::vector<const MemoryKind*> memories_on(const ModelConfig& cfg) {
  std::vector<const MemoryKind*> on;
  if (!block_kinds().get(cfg.block).memory) return on;
  for (const MemoryKind& k : memory_kinds().kinds())
    if (k.on(cfg)) on.push_back(&k);
  return on;
}

double memory_parameters(const ModelConfig& cfg) {
  double n = 0;
  for (const MemoryKind* k : memories_on(cfg))
    if (k->parameters) n += k->parameters(cfg);
  return n;
}

MemoryUse memory_use(const ModelConfig& cfg) {
  MemoryUse use;
  if (!block_kinds().get(cfg.block).memory) return use;
  for (const MemoryKind& k : memory_kinds().kinds())
    if (k.use) k.use(cfg, k.on(cfg), use);
  return use;
}

std::vector<Tensor>& SegmentMemory::group(const std::string& name) {
  for (Group& g : groups)
    if (g.name == name) return g.tensors;
  groups.push_back({name, {}});
  return groups.back().tensors;
}

const std::vector<Tensor>* SegmentMemory::find(const std::string& name) const {
  for (const Group& g : groups)
    if (g.name == name) return &g.tensors;
  return nullptr;
}

int64_t SegmentMemory::batch() const {
  for (const Group& g : groups)
    for (const Tensor& t : g.tensors)
      if (t.defined() && t.rank() >= 2 && t.dim(1) > 0) return t.dim(0);
  return 0;
}

}  // namespace tapeformer
