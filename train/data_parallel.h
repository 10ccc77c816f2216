// DataParallel: a batch split into row shards that run forward + backward at
// the same time, one shard per thread, each on its own replica of the model.
//
//   DataParallel dp(model, /*shards=*/2);
//   const double loss = dp.train_batch(batch, /*scale=*/1.0f, dropout_rng);  // grads in model
//   optimizer.step();
//
// Why: a char-LM step is a chain of small ops (a few hundred microseconds
// each). Splitting every op across threads pays a fork/join and an idle wait
// per op; splitting the batch instead lets each thread run a whole
// forward + backward alone, with one join per step. On this project's 2-core
// benchmark machine that is about 1.4x faster than op-level splitting.
//
// Contract
// - Shard k takes a contiguous, near-equal slice of the batch rows (the first
//   B % S shards get one row more); there are min(shards, B) non-empty shards.
//   Shard 0 runs on `model`, shard k > 0 on a replica whose parameters alias
//   the model's values (Module::alias_parameters) and own their gradients.
// - Each shard backpropagates (its mean loss) * scale * (its counted targets /
//   all counted targets; targets equal to kIgnoreTarget do not count), so the
//   model receives the gradient of scale * (mean loss of the whole batch), as
//   without sharding. Replica gradients are added into the model's in a
//   fixed binary tree over the shard index (train/shard_tree.h) after all
//   shards finish: for a given shard count the result is the same bit for
//   bit on any number of threads (ops inside a shard run serially).
//   Different shard counts differ only by rounding.
// - Dropout: with one shard the caller's Rng is used directly; with several,
//   each shard gets an Rng seeded by the next draws of the caller's Rng (in
//   shard order), so runs are reproducible and resumable.
// - Thread safety: the model and replicas must not be used elsewhere during
//   a call. Tapes are per thread; each shard records and consumes its own.
// - Several processes (a ProcessGroup of N ranks, `mpirun -np N`): the batch
//   is cut into N * shards shards, rank r runs shards [r * shards, (r + 1) *
//   shards) and every rank draws every shard's dropout seed. Gradients are
//   summed across the ranks element by element in the same tree, as a
//   single process sums its shards, and every rank ends with the sum in its
//   model: N ranks x S shards give the bits of one process with N * S
//   shards. With S a power of two a rank's shards are a subtree: it sends
//   one partial sum, so the bytes on the wire do not grow with S. Every
//   rank is given the whole batch (each uses its rows) and calls every
//   method in the same order; evaluation batches are shared out among the
//   ranks; a segment memory is gathered whole on every rank after each batch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tapeformer/core/rng.h"
#include "tapeformer/data/sampler.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/train/process_group.h"

namespace tapeformer {

class DataParallel {
 public:
  // shards >= 1: this process's. Builds shards - 1 replicas of `model` (which
  // must outlive this). With a group of several processes, every rank builds
  // one with the same shard count.
  DataParallel(LanguageModel& model, int shards, std::shared_ptr<ProcessGroup> group = nullptr);
  // Drops gradients that are views of memory shared with the other ranks (freed with this).
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int shards() const { return static_cast<int>(replicas_.size()) + 1; }
  // Shards of a batch of that many rows over all processes (one process: at
  // most one per row). Throws when the processes have more shards than rows.
  int64_t total_shards(int64_t batch_rows) const;
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

  // Forward + backward of `batch` (B, T); the gradient of scale * mean loss
  // accumulates into the model's parameters. Returns the mean loss over the
  // counted targets (the value, before `scale`). Under NoGradGuard, forward
  // only. With a segment memory (Transformer-XL, for the whole batch: row r
  // of each layer's memory belongs to row r of the batch), each shard reads
  // and updates its rows of it.
  double train_batch(const Batch& batch, float scale, Rng& dropout_rng, SegmentMemory* memory = nullptr);
  // After optimizer step number `step`: the batch statistics of every shard
  // and rank summed into the model's (Module::statistics), then
  // Module::optimizer_stepped on the model, then, when a layer changed a
  // buffer, the replicas copy the buffers (parameters are shared already).
  void optimizer_stepped(int64_t step);
  // The replicas copy the model's buffers (after loading a checkpoint into it).
  void sync_buffers();

 private:
  void backward_auxiliary(float scale);
  static Var with_batch_losses(const Var& scaled_loss, const LanguageModel& model, float scale);

 public:

  // Mean loss of each batch without gradients (the model must be in eval mode
  // for deterministic results), batches spread over the threads.
  std::vector<double> losses(const std::vector<Batch>& batches, Rng& rng) const;

 private:
  static constexpr int64_t kReduceBlock = 1 << 14;
  void reduce_gradients();
  void reduce_statistics();
  void reduce_across_processes(const std::vector<LanguageModel*>& models);  // this rank's shards, in order
  Tensor gather_rows(const Tensor& mine, const std::vector<int64_t>& rank_rows) const;

  LanguageModel& model_;
  std::shared_ptr<ProcessGroup> group_;  // null: one process
  std::vector<std::unique_ptr<LanguageModel>> replicas_;
  void exchange_partials();  // this rank's partial (in the model's gradients) with the other ranks'
  void exchange_shared(const NamedVars& params, const std::vector<int64_t>& offset);
  struct Exchange {  // the exchanges' buffers, reused from step to step
    std::vector<Scalar> send, recv, sums, total;
    Tensor flat;  // exchange_partials: every parameter's gradient, in parameter order (P)
    int64_t shared_floats = -1;  // P the shared segments were made for (-1: not tried yet)
    std::unique_ptr<ProcessGroup::SharedFloats> partials, totals;  // null: ranks on several machines
    std::shared_ptr<Storage> shared_totals;    // totals' P floats, for gradient views of them
    std::optional<bool> model_has_auxiliary;  // an auxiliary loss of the parameters (Module::auxiliary_loss)
  } exchange_;
};

// Rows [begin, end) of a batch.
Batch slice_rows(const Batch& batch, int64_t begin, int64_t end);

}  // namespace tapeformer
