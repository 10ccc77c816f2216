// Memories: what a stack of layers carries from one segment to the next
// (Transformer-XL's segment memory, the Compressive Transformer's compressed
// rows, the Memorizing Transformer's keys and values), kept as named groups
// of per-row tensors (row b belongs to batch row b), so that sharding over
// threads and MPI ranks and the checkpoint handle every memory alike,
// knowing none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/core/tensor.h"

namespace tapeformer {

// What a stack's memories carry from one segment to the next: named groups
// of tensors whose first dim is the batch row and second the positions held
// (growing from none). Empty before the first segment.
struct SegmentMemory {
  struct Group {
    std::string name;
    std::vector<Tensor> tensors;  // (B, n, ...) each; undefined: nothing held yet
  };
  std::vector<Group> groups;  // in the order the memories made them
  int64_t limit = 0;          // positions the segment memory keeps; 0: the model's mem_len (evaluation may keep more)

  // The group named `name`, added (empty) at the end when missing.
  std::vector<Tensor>& group(const std::string& name);
  // The group named `name`, or null.
  const std::vector<Tensor>* find(const std::string& name) const;
  // The batch rows of the first tensor that holds a position, 0 when none does.
  int64_t batch() const;
  void reset() { groups.clear(); }
};

// A group of a model's segment memory as checkpoints hold it: its name,
// tensors (one per layer, or per part), the most positions each may hold,
// their width, the words naming it in errors, and the checkpoint format that
// first held it (older files are read without it).
struct MemoryGroupSpec {
  std::string name;
  int64_t tensors = 0, max_rows = 0, width = 0;
  std::string what;
  uint32_t since_format = 1;
};

}  // namespace tapeformer
