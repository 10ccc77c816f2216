// What a checkpoint keeps of a run's data stream (its `sampler` bytes): the
// train batch source's position, and for a run that carries a segment
// memory (Transformer-XL) the memory too, so that --resume continues the
// identical run.
//
//   c.sampler = to_bytes(SourcePosition{&source});                      // a run without a memory
//   c.sampler = to_bytes(StreamState{&source, &memory, B, groups});     // with one
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cereal/archives/binary.hpp>

#include "tapeformer/data/sampler.h"
#include "tapeformer/layers/memory/memory.h"
#include "tapeformer/train/checkpoint.h"

namespace tapeformer {

// The train batch source's position in the checkpoint.
struct SourcePosition {
  BatchSource* source;
  void save(cereal::BinaryOutputArchive& ar) const { source->save_position(ar); }
  void load(cereal::BinaryInputArchive& ar) { source->load_position(ar); }
};

// A memory run's data stream in the checkpoint (Transformer-XL): the batch
// source's position and the segment memory it carries, each group the model
// declares (MemoryUse::groups) in its order, as a count and then each
// tensor's positions and values; a group a file's format predates is not read.
struct StreamState {
  BatchSource* source;
  SegmentMemory* memory;
  int64_t batch;
  std::vector<MemoryGroupSpec> groups;
  uint32_t format = kCheckpointVersion;  // of the file read

  void save(cereal::BinaryOutputArchive& ar) const {
    source->save_position(ar);
    for (const MemoryGroupSpec& g : groups) {
      const std::vector<Tensor>* held = memory->find(g.name);
      save_group(ar, held != nullptr ? *held : std::vector<Tensor>());
    }
  }
  void load(cereal::BinaryInputArchive& ar) {
    source->load_position(ar);
    memory->reset();
    for (const MemoryGroupSpec& g : groups) {
      if (g.since_format > format) continue;
      std::vector<Tensor> tensors = load_group(ar, g);
      if (!tensors.empty()) memory->group(g.name) = std::move(tensors);
    }
  }

  // A group's (B, M, width) tensors: a count, then M and the values of each
  // (a tensor that holds nothing yet as M = 0).
  static void save_group(cereal::BinaryOutputArchive& ar, const std::vector<Tensor>& all);
  // g.tensors tensors, or none.
  std::vector<Tensor> load_group(cereal::BinaryInputArchive& ar, const MemoryGroupSpec& g) const;
};

}  // namespace tapeformer
