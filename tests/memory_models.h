// Shared by the memory tests (tests/layers/test_compressive.cpp,
// test_memorizing.cpp): a tiny model with a Transformer-XL memory, normal
// tensors and random segments over its vocabulary of 11.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/core/rng.h"
#include "tapeformer/layers/block/block.h"
#include "tapeformer/layers/model_config.h"

namespace memory_models {

using namespace tapeformer;

// Vocabulary 11, segments of 4, 2 layers of 2 heads, width 16, txl positions, model.mem_len = mem_len.
inline ModelConfig tiny_config(int64_t mem_len, const std::string& block = "standard") {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 4;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.positional = "txl";
  c.block = block;
  c.options["mem_len"] = mem_len;
  return c;
}

// The block kinds that carry memories (BlockKind::memory), from the registry.
inline std::vector<std::string> memory_blocks() {
  std::vector<std::string> out;
  for (const BlockKind& k : block_kinds().kinds())
    if (k.memory) out.push_back(k.name);
  return out;
}

// c with memory kind `kind` on: its small test values (ModelOption::small),
// and those of the kinds it builds on, first.
inline void turn_on(ModelConfig& c, const MemoryKind& kind) {
  for (const std::string& need : kind.needs) turn_on(c, memory_kinds().get(need));
  for (const ModelOption& o : kind.options)
    if (o.small) c.options[o.name] = *o.small;
}

// The tensors of a memory's group ("layers", "compressed", "external"), none when it has none.
inline const std::vector<Tensor>& group_of(const SegmentMemory& memory, const std::string& name) {
  static const std::vector<Tensor> none;
  const std::vector<Tensor>* g = memory.find(name);
  return g != nullptr ? *g : none;
}

// The positions a group's first tensor holds (0: none yet).
inline int64_t held(const SegmentMemory& memory, const std::string& name) {
  const std::vector<Tensor>& g = group_of(memory, name);
  return g.empty() || !g[0].defined() ? 0 : g[0].dim(1);
}

// A tensor of N(0, 1) draws.
inline Tensor normal(const Shape& shape, Rng& rng) {
  Tensor t = Tensor::zeros(shape);
  rng.fill_normal(t, 0.0f, 1.0f);
  return t;
}

// (B, T) ids drawn uniformly from the 11 tokens.
inline IndexTensor segment(int64_t B, int64_t T, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(B * T));
  for (auto& x : v) x = static_cast<int32_t>(rng.below(11));
  return IndexTensor({B, T}, v);
}

}  // namespace memory_models
