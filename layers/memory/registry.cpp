// The state every memory keeps its tensors in.
#include "tapeformer/layers/memory/memory.h"

namespace tapeformer {

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
