#include "train/data_parallel.h"

#include <algorithm>
#include <optional>

#include "autograd/ops.h"
#include "autograd/tape.h"
#include "core/eigen.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/profile.h"
#include "core/storage.h"

namespace tapeformer {

Batch slice_rows(const Batch& batch, int64_t begin, int64_t end) {
  const Shape& s = batch.inputs.shape;
  TAPEFORMER_CHECK(s.rank() == 2 && batch.targets.shape == s, "slice_rows: inputs ", s, " and targets ",
                   batch.targets.shape, " must be the same (B, T)");
  TAPEFORMER_CHECK(0 <= begin && begin <= end && end <= s[0], "slice_rows: rows [", begin, ", ", end,
                   ") out of range for a batch of ", s[0]);
  const int64_t T = s[1];
  auto rows = [&](const IndexTensor& t) {
    return IndexTensor({end - begin, T}, std::vector<int32_t>(t.data.begin() + begin * T, t.data.begin() + end * T));
  };
  return {rows(batch.inputs), rows(batch.targets)};
}

DataParallel::DataParallel(TransformerLM& model, int shards) : model_(model) {
  TAPEFORMER_CHECK(shards >= 1, "DataParallel: shards must be >= 1, got ", shards);
  for (int k = 1; k < shards; ++k) {
    Rng unused(0);  // the replica's own init is replaced by aliasing
    auto replica = std::make_unique<TransformerLM>(model.config(), unused);
    replica->alias_parameters(model);
    replicas_.push_back(std::move(replica));
  }
}

void DataParallel::optimizer_stepped(int64_t step) {
  if (model_.optimizer_stepped(step)) sync_buffers();
}

void DataParallel::sync_buffers() {
  for (auto& r : replicas_) r->copy_buffers_from(model_);
}

double DataParallel::train_batch(const Batch& batch, float scale, Rng& dropout_rng, SegmentMemory* memory) {
  const int64_t B = batch.inputs.shape.rank() == 2 ? batch.inputs.shape[0] : 0;
  TAPEFORMER_CHECK(B >= 1, "DataParallel: expected a (B, T) batch with B >= 1, got ", batch.inputs.shape);
  const int64_t S = std::min<int64_t>(shards(), B);
  const auto forward = [](const TransformerLM& m, const IndexTensor& ids, SegmentMemory* mem, Rng& rng) {
    return mem != nullptr ? m.forward(ids, *mem, rng) : m.forward(ids, rng);  // (B, T, V)
  };
  std::optional<profile::Scope> timed;
  timed.emplace("forward + backward", profile::Kind::Phase);
  if (S == 1) {
    Var loss = cross_entropy(forward(model_, batch.inputs, memory, dropout_rng), batch.targets);
    if (grad_enabled()) backward(mul_scalar(loss, scale));
    backward_auxiliary(scale);
    return loss.item();
  }

  struct Shard {
    TransformerLM* model;
    Batch rows;
    Rng rng;
    int64_t weight;  // its share of the batch's loss: rows, or counted targets when some are ignored
    double loss = 0;
    SegmentMemory memory;  // its rows of the batch's memory
    int64_t row = 0;
  };
  const auto counted = [](const IndexTensor& targets) {
    return static_cast<int64_t>(std::count_if(targets.data.begin(), targets.data.end(),
                                              [](int32_t t) { return t != kIgnoreTarget; }));
  };
  const int64_t all_counted = counted(batch.targets);
  const bool ignores = all_counted != batch.targets.numel();
  const int64_t total = ignores ? all_counted : B;
  std::vector<Shard> work;
  for (int64_t k = 0, row = 0; k < S; ++k) {
    const int64_t n = B / S + (k < B % S ? 1 : 0);
    TransformerLM* m = k == 0 ? &model_ : replicas_[static_cast<size_t>(k - 1)].get();
    m->train(model_.is_training());
    Batch rows = slice_rows(batch, row, row + n);
    const int64_t weight = ignores ? counted(rows.targets) : n;
    work.push_back({m, std::move(rows), Rng(dropout_rng.next_u64()), weight, 0, {}, row});
    if (memory != nullptr) {
      SegmentMemory& part = work.back().memory;
      part.limit = memory->limit;
      for (const Tensor& t : memory->layers) part.layers.push_back(t.slice(0, row, row + n).contiguous());
    }
    row += n;
  }
  const bool grad = grad_enabled();
  parallel::parallel_for(S, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      Shard& w = work[static_cast<size_t>(k)];
      const Storage::ArenaScope arena(static_cast<int>(k % (Storage::kMaxArenas - 1)) + 1);
      // Each shard's mean loss weighted by its share, so the model gets the
      // gradient of the whole batch's mean (over counted targets).
      const float share = total > 0 ? static_cast<float>(w.weight) / static_cast<float>(total) : 0.0f;
      SegmentMemory* mem = memory != nullptr ? &w.memory : nullptr;
      if (!grad) {  // grad mode is per thread: follow the caller's
        NoGradGuard no_grad;
        w.loss = cross_entropy(forward(*w.model, w.rows.inputs, mem, w.rng), w.rows.targets).item();
        continue;
      }
      Var loss = cross_entropy(forward(*w.model, w.rows.inputs, mem, w.rng), w.rows.targets);
      backward(mul_scalar(loss, scale * share));
      w.loss = loss.item();
    }
  });

  timed.reset();
  if (memory != nullptr) {  // the shards' rows back into the batch's memory, in row order
    NoGradGuard no_grad;
    memory->layers.assign(work[0].memory.layers.size(), Tensor());
    for (size_t l = 0; l < memory->layers.size(); ++l) {
      std::vector<Var> parts;
      for (const Shard& w : work) parts.emplace_back(w.memory.layers[l]);
      memory->layers[l] = concat(parts, 0).value();  // (B, M, C)
    }
  }
  if (grad) reduce_gradients();
  backward_auxiliary(scale);
  double sum = 0;
  for (const Shard& w : work) sum += w.loss * static_cast<double>(w.weight);
  return total > 0 ? sum / static_cast<double>(total) : 0.0;
}

// Layers' auxiliary losses (adaptive span's penalty) once per batch, on the
// model itself: they depend on parameters only, not on the batch's rows.
// The returned loss stays the cross-entropy alone.
void DataParallel::backward_auxiliary(float scale) {
  if (!grad_enabled()) return;
  const Var aux = model_.auxiliary_loss();
  if (aux.defined()) backward(mul_scalar(aux, scale));
}

// Replica gradients into the model's, in shard order, in one parallel pass
// over fixed blocks: the same sums for any thread count.
void DataParallel::reduce_gradients() {
  const profile::Scope timed("gradient reduction", profile::Kind::Phase);
  const NamedVars params = model_.named_parameters();
  std::vector<NamedVars> theirs;
  for (const auto& replica : replicas_) theirs.push_back(replica->named_parameters());
  std::vector<Scalar*> dst(params.size(), nullptr);
  std::vector<std::vector<const Scalar*>> src(params.size());
  std::vector<int64_t> sizes(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    const Var& p = params[i].second;
    for (const NamedVars& r : theirs) {
      const Var& rv = r[i].second;
      if (!rv.has_grad()) continue;
      if (!p.has_grad()) {
        p.node()->grad = rv.grad().contiguous();  // the first gradient is taken as is
      } else {
        src[i].push_back(rv.dense_grad().data());
      }
    }
    if (src[i].empty()) continue;
    Tensor& g = p.dense_grad();
    dst[i] = g.data();
    sizes[i] = g.numel();
  }
  parallel::for_each_block(sizes, kReduceBlock, [&](size_t i, int64_t b, int64_t e) {
    auto out = eigen::array(dst[i] + b, e - b);
    for (const Scalar* s : src[i]) out += eigen::array(s + b, e - b);
  });
  for (const NamedVars& r : theirs)
    for (const auto& named : r) named.second.zero_grad();
}

std::vector<double> DataParallel::losses(const std::vector<Batch>& batches, Rng& rng) const {
  TAPEFORMER_CHECK(!model_.is_training(), "DataParallel::losses: put the model in eval mode first");
  std::vector<double> out(batches.size());
  parallel::parallel_for(static_cast<int64_t>(batches.size()), 1, [&](int64_t b0, int64_t b1) {
    NoGradGuard no_grad;  // per thread
    Rng local = rng;      // eval mode: dropout is off and draws nothing
    for (int64_t i = b0; i < b1; ++i) {
      const Batch& b = batches[static_cast<size_t>(i)];
      out[static_cast<size_t>(i)] = cross_entropy(model_.forward(b.inputs, local), b.targets).item();
    }
  });
  return out;
}

}  // namespace tapeformer
