// Memories: what a stack of layers carries from one segment to the next, as
// a family of kinds with a table (memory_kinds()) beside the other families:
// Transformer-XL's segment memory ("xl", layers/memory/xl.cpp), the
// Compressive Transformer's compressed memory ("compressive",
// compressive.h) and the Memorizing Transformer's external memory
// ("memorizing", memorizing.h).
//
// A kind is on when its length key is > 0 (model.mem_len, model.cmem_len,
// model.xmem_len); a block kind that carries memories (BlockKind::memory)
// runs every kind that is on, in the table's order, and a kind may build on
// the ones before it (the compressed memory compresses what falls out of
// the segment memory). What a memory keeps lives in a SegmentMemory as
// named groups of per-row tensors (row b belongs to batch row b), so that
// sharding over threads and MPI ranks and the checkpoint handle every kind
// alike, knowing none.
//
// For each layer i of a segment the stack asks the memories, in order:
//   rows = memory.attended(state, i, rows)      what layer i attends to before its segment
//   y    = memory.around(state, i, layer)       the layer's forward, with what the memory lends
//                                               its attention (the external memory)
//   memory.update(state, layer, keep, carry)    the segment's first `keep` positions move in;
//                                               `carry` passes what fell out of one memory on
// A memory's auxiliary loss (the learned compression's reconstruction loss)
// goes through the one channel every layer uses (Module::auxiliary_loss).
// Training, evaluation and sampling all read a model with memories this way,
// segment after segment, gradient recorded or not: `tapeformer check` runs a
// kind over three segments and compares sampling's reading with training's.
// Adding a kind: docs/adding-a-memory-kind.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/autograd/var.h"
#include "tapeformer/core/registry.h"
#include "tapeformer/layers/model_config.h"
#include "tapeformer/layers/module.h"

namespace tapeformer {

class Attention;

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

// What a model carries from segment to segment, from the memories its
// config turns on: mem_len positions (0: none), ext_len tokens read again at
// the start of each segment, and the groups its checkpoint holds.
struct MemoryUse {
  int64_t mem_len = 0, ext_len = 0;
  std::vector<MemoryGroupSpec> groups;
  bool carried() const { return mem_len > 0; }
};

// What passes from one memory to the next in a layer's update.
struct MemoryCarry {
  Tensor evicted;       // (B, F, C): rows that fell out of the segment memory, oldest first; undefined: none
  bool wanted = false;  // a later memory reads `evicted` (so the segment memory computes it)
};

// The layer a memory serves in one segment.
struct MemoryLayer {
  size_t index = 0;
  Var input;  // the layer's input rows of the segment, x (B, T, C): what its memory rows are
  // Content attention of the segment's queries over rows (B, N, C), every
  // weight held fixed (the Compressive Transformer's reconstruction target).
  std::function<Var(const Var& rows)> content_attention;
};

class Memory : public Module {
 public:
  // Before the layers run on a segment (per-segment state, such as a loss, starts afresh).
  virtual void begin_segment(SegmentMemory& state, size_t layers) const {}
  // What layer i attends to before its segment, given what the memories
  // before this one give (`rows`, undefined: nothing): (B, n, C).
  virtual Tensor attended(SegmentMemory& state, size_t layer, const Tensor& rows) const { return rows; }
  // Layer i's forward `run`, with whatever this memory lends the layer's
  // attention for the call; by default, as it is.
  virtual Var around(SegmentMemory& state, size_t layer, const std::function<Var()>& run) const { return run(); }
  // Whether it reads the rows that fall out of the memories before it.
  virtual bool wants_evicted() const { return false; }
  // Whether around() lends layer i's forward something that is gone by the
  // backward (an external memory the forward also writes to): activation
  // recompute then keeps that layer's tensors instead of running it again.
  virtual bool lends(size_t layer) const { return false; }
  // After layer i ran on its segment: the first `keep` positions of
  // layer.input move into the memory (the last ext_len come again with the
  // next segment); keep >= 1.
  virtual void update(SegmentMemory& state, const MemoryLayer& layer, int64_t keep, MemoryCarry& carry) const {}
};

// What a memory needs of the stack it serves, when it is built.
struct MemoryHost {
  int64_t layers = 0;
  // Layer i's attention, or null when the stack's layers have none.
  std::function<std::shared_ptr<Attention>(size_t layer)> attention;
  // Puts `wrapper` in the place of layer i's attention (the same name and
  // place among its modules): the Memorizing Transformer's wrapper.
  std::function<void(size_t layer, std::shared_ptr<Attention> wrapper)> wrap_attention;
};

struct MemoryKind {
  std::string name;
  std::string summary;               // one line, for errors and docs
  std::vector<ModelOption> options;  // its model.* keys; the first, its length, turns it on when > 0
  std::vector<std::string> needs;    // kinds it builds on, which must be on too ("xl")
  std::function<std::shared_ptr<Memory>(const ModelConfig&, const MemoryHost&)> make;
  // Adds what it carries to a model's MemoryUse (lengths, checkpoint
  // groups); called for every kind of a block kind with memories, on or off
  // (a kind may keep an empty group in every memory run's checkpoint).
  std::function<void(const ModelConfig&, bool on, MemoryUse&)> use;
  // Parameters it adds to a stack of the config (a learned compression); null: none.
  std::function<double(const ModelConfig&)> parameters;
  // Throws Error naming the keys when the config's values do not suit it (on or off).
  std::function<void(const ModelConfig&)> check;

  // Whether `cfg` turns it on: its first option (its length) > 0.
  bool on(const ModelConfig& cfg) const;
};

// The table of memory kinds (layers/memory/registry.cpp). A program may add its own.
Registry<MemoryKind>& memory_kinds();

// The memory kinds a config turns on, in the table's order (none when its
// block kind carries no memories).
std::vector<const MemoryKind*> memories_on(const ModelConfig& cfg);
// What a model of the config carries: every kind's use (nothing when its
// block kind carries no memories).
MemoryUse memory_use(const ModelConfig& cfg);
// Parameters the memories a config turns on add to a stack (a learned
// compression, an external memory's gates).
double memory_parameters(const ModelConfig& cfg);

}  // namespace tapeformer
