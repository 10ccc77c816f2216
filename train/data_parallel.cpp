#include "tapeformer/train/data_parallel.h"

#include <algorithm>
#include <optional>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/eigen.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/profile.h"
#include "tapeformer/core/storage.h"
#include "tapeformer/train/shard_tree.h"

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
  Batch out{rows(batch.inputs), rows(batch.targets), {}, {}};
  if (!batch.starts.empty()) out.starts.assign(batch.starts.begin() + begin, batch.starts.begin() + end);
  for (const auto& [name, extra] : batch.extra) {  // (B, T, ...): the rows' ids
    const Shape& r = extra.shape;
    TAPEFORMER_CHECK(r.rank() >= 2 && r[0] == s[0] && r[1] == T, "slice_rows: input \"", name, "\" ", r,
                     " must be (B, T, ...) for inputs ", s);
    const int64_t n = extra.numel() / s[0];
    Shape part = r;
    part[0] = end - begin;
    out.extra.emplace(name, IndexTensor(part, std::vector<int32_t>(extra.data.begin() + begin * n,
                                                                    extra.data.begin() + end * n)));
  }
  return out;
}

DataParallel::DataParallel(LanguageModel& model, int shards, std::shared_ptr<ProcessGroup> group)
    : model_(model), group_(std::move(group)) {
  TAPEFORMER_CHECK(shards >= 1, "DataParallel: shards must be >= 1, got ", shards);
  for (int k = 1; k < shards; ++k) {
    Rng unused(0);  // the replica's own init is replaced by aliasing
    std::unique_ptr<LanguageModel> replica = make_model(model.config(), unused);
    replica->alias_parameters(model);
    replica->set_recompute(model.recompute_every());
    replicas_.push_back(std::move(replica));
  }
}

DataParallel::~DataParallel() {
  if (!exchange_.shared_totals) return;
  const Scalar* lo = exchange_.shared_totals->data();
  const Scalar* hi = lo + exchange_.shared_totals->size();
  for (const Var& p : model_.parameters())
    if (p.has_grad() && p.grad().data() >= lo && p.grad().data() < hi) p.zero_grad();
}

void DataParallel::optimizer_stepped(int64_t step) {
  reduce_statistics();
  if (model_.optimizer_stepped(step)) sync_buffers();
}

// Every shard's batch statistics (Module::statistics), summed into the
// model's in the shard tree: the ranks exchange theirs whole (a few floats
// per layer), and each sums all S shards in the same order.
void DataParallel::reduce_statistics() {
  const NamedTensors mine = model_.statistics();
  if (mine.empty() || (replicas_.empty() && !group_)) return;
  int64_t n = 0;
  for (const auto& [name, t] : mine) n += t.numel();
  const int64_t local = shards();
  std::vector<Scalar> flat(static_cast<size_t>(local * n));  // this rank's shards, in shard order
  for (int64_t k = 0; k < local; ++k) {
    const NamedTensors stats = k == 0 ? mine : replicas_[static_cast<size_t>(k - 1)]->statistics();
    Scalar* dst = flat.data() + k * n;
    for (const auto& [name, t] : stats) {
      const Tensor c = t.contiguous();
      dst = std::copy(c.data(), c.data() + c.numel(), dst);
    }
  }
  if (group_) flat = allgather_equal(*group_, flat);  // every rank's, in rank order = shard order
  const int64_t S = static_cast<int64_t>(flat.size()) / n;
  std::vector<Scalar> total(static_cast<size_t>(n)), scratch(static_cast<size_t>(shard_tree::scratch_floats(S, n)));
  shard_tree::sum(0, S, [&](int64_t k) { return flat.data() + k * n; }, total.data(), n, scratch.data());
  const Scalar* src = total.data();
  for (const auto& [name, t] : mine) {
    Tensor dst = t;
    std::copy(src, src + t.numel(), dst.data());
    src += t.numel();
  }
  for (auto& r : replicas_) r->zero_statistics();
}

void DataParallel::sync_buffers() {
  for (auto& r : replicas_) r->copy_buffers_from(model_);
}

double DataParallel::train_batch(const Batch& batch, float scale, Rng& dropout_rng, SegmentMemory* memory) {
  const int64_t B = batch.inputs.shape.rank() == 2 ? batch.inputs.shape[0] : 0;
  TAPEFORMER_CHECK(B >= 1, "DataParallel: expected a (B, T) batch with B >= 1, got ", batch.inputs.shape);
  // Shards of the whole batch: this process's, or every rank's (each rank
  // runs shards [first, first + local)); a batch smaller than one process's
  // shard count leaves its extra shards empty.
  const int64_t local = group_ ? shards() : std::min<int64_t>(shards(), B);
  const int64_t S = total_shards(B), first = group_ ? group_->rank() * local : 0;
  const auto forward = [](const LanguageModel& m, const Batch& b, SegmentMemory* mem, Rng& rng) {
    ModelContext ctx;
    ctx.rng = &rng;
    ctx.memory = mem;
    ctx.inputs = b.extra.empty() ? nullptr : &b.extra;
    ctx.targets = &b.targets;
    return m.forward(b.inputs, ctx);  // (B, T, V)
  };
  std::optional<profile::Scope> timed;
  timed.emplace("forward + backward", profile::Kind::Phase);
  if (S == 1) {  // one shard in all: the caller's Rng, no replicas
    Var loss = cross_entropy(forward(model_, batch, memory, dropout_rng), batch.targets);
    if (grad_enabled()) backward(with_batch_losses(mul_scalar(loss, scale), model_, scale));
    backward_auxiliary(scale);
    return loss.item();
  }

  struct Shard {
    LanguageModel* model;
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
  std::vector<int64_t> rank_rows(group_ ? static_cast<size_t>(group_->size()) : 1, 0);  // batch rows per rank
  for (int64_t k = 0, row = 0; k < S; ++k) {
    const int64_t n = B / S + (k < B % S ? 1 : 0);
    rank_rows[static_cast<size_t>(k / local)] += n;
    // Every rank draws every shard's dropout seed, so each shard's stream is
    // the one a single process with S shards would give it.
    const uint64_t seed = dropout_rng.next_u64();
    if (k < first || k >= first + local) {
      row += n;
      continue;
    }
    LanguageModel* m = k == first ? &model_ : replicas_[static_cast<size_t>(k - first - 1)].get();
    m->train(model_.is_training());
    Batch rows = slice_rows(batch, row, row + n);
    const int64_t weight = ignores ? counted(rows.targets) : n;
    work.push_back({m, std::move(rows), Rng(seed), weight, 0, {}, row});
    if (memory != nullptr) {
      SegmentMemory& part = work.back().memory;
      part.limit = memory->limit;
      // Every group's rows of this shard (an undefined tensor stays undefined).
      for (const SegmentMemory::Group& g : memory->groups) {
        std::vector<Tensor>& mine = part.group(g.name);
        for (const Tensor& t : g.tensors) mine.push_back(t.defined() ? t.slice(0, row, row + n).contiguous() : t);
      }
    }
    row += n;
  }
  const bool grad = grad_enabled();
  // Gradients already in the model (earlier micro-batches of the step, the
  // same sum on every rank) belong to shard 0, as in one process where shard
  // 0 runs on the model: the other ranks drop their copy, or the exchange
  // would count it once per rank.
  if (grad && group_ && group_->rank() != 0)
    for (const Var& p : model_.parameters()) p.zero_grad();
  parallel::parallel_for(static_cast<int64_t>(work.size()), 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      Shard& w = work[static_cast<size_t>(k)];
      const Storage::ArenaScope arena(static_cast<int>(k % (Storage::kMaxArenas - 1)) + 1);
      // Each shard's mean loss weighted by its share, so the model gets the
      // gradient of the whole batch's mean (over counted targets).
      const float share = total > 0 ? static_cast<float>(w.weight) / static_cast<float>(total) : 0.0f;
      SegmentMemory* mem = memory != nullptr ? &w.memory : nullptr;
      if (!grad) {  // grad mode is per thread: follow the caller's
        NoGradGuard no_grad;
        w.loss = cross_entropy(forward(*w.model, w.rows, mem, w.rng), w.rows.targets).item();
        continue;
      }
      Var loss = cross_entropy(forward(*w.model, w.rows, mem, w.rng), w.rows.targets);
      backward(with_batch_losses(mul_scalar(loss, scale * share), *w.model, scale * share));
      w.loss = loss.item();
    }
  });

  timed.reset();
  if (memory != nullptr) {  // the shards' rows back into the batch's memory, in row order
    NoGradGuard no_grad;
    // Each group the shards' memories hold (a tensor that holds nothing yet stays undefined).
    for (const SegmentMemory::Group& g : work[0].memory.groups) {
      const auto shard_group = [&](const Shard& w) -> const std::vector<Tensor>& {
        const std::vector<Tensor>* t = w.memory.find(g.name);
        TAPEFORMER_CHECK(t != nullptr && t->size() == g.tensors.size(), "DataParallel: shard memories differ in group \"",
                         g.name, "\"");
        return *t;
      };
      std::vector<Tensor>& whole = memory->group(g.name);
      whole.assign(g.tensors.size(), Tensor());
      for (size_t l = 0; l < whole.size(); ++l) {
        if (!g.tensors[l].defined()) continue;
        std::vector<Var> parts;
        for (const Shard& w : work) parts.emplace_back(shard_group(w)[l]);
        whole[l] = concat(parts, 0).value();                    // (this process's rows, M, C)
        if (group_) whole[l] = gather_rows(whole[l], rank_rows);  // (B, M, C) on every rank
      }
    }
  }
  if (grad) {
    if (group_) {
      std::vector<LanguageModel*> models;
      for (const Shard& w : work) models.push_back(w.model);
      reduce_across_processes(models);
    } else {
      reduce_gradients();
    }
  }
  backward_auxiliary(scale);
  // Each shard's loss times its weight, summed in shard order (every rank's).
  std::vector<double> weighted;
  for (const Shard& w : work) weighted.push_back(w.loss * static_cast<double>(w.weight));
  if (group_) weighted = allgather_equal(*group_, weighted);
  double sum = 0;
  for (double x : weighted) sum += x;
  return total > 0 ? sum / static_cast<double>(total) : 0.0;
}

int64_t DataParallel::total_shards(int64_t batch_rows) const {
  if (!group_) return std::min<int64_t>(shards(), batch_rows);
  const int64_t all = static_cast<int64_t>(shards()) * group_->size();
  TAPEFORMER_CHECK(all <= batch_rows, "DataParallel: ", group_->size(), " processes x ", shards(), " shards = ", all,
                   " shards, more than the batch's ", batch_rows, " rows (lower train.shards or the process count, or "
                   "raise train.batch_size)");
  return all;
}

// Rows of a (rows, ...) tensor from every rank, in rank order: ranks hold
// consecutive rows of the batch, rank_rows[r] of them.
Tensor DataParallel::gather_rows(const Tensor& mine, const std::vector<int64_t>& rank_rows) const {
  const int64_t row_floats = mine.dim(0) > 0 ? mine.numel() / mine.dim(0) : 0;
  std::vector<int64_t> counts;
  int64_t batch_rows = 0;
  for (int64_t rows : rank_rows) {
    counts.push_back(rows * row_floats * static_cast<int64_t>(sizeof(Scalar)));
    batch_rows += rows;
  }
  Shape shape = mine.shape();
  shape[0] = batch_rows;
  Tensor all = Tensor::empty(shape);
  const Tensor c = mine.contiguous();
  group_->allgather(c.data(), c.numel() * static_cast<int64_t>(sizeof(Scalar)), all.data(), counts);
  return all;
}

namespace {

// Per-thread scratch of shard_tree::sum for one block.
float* tree_scratch(int64_t K, int64_t n) {
  thread_local std::vector<float> scratch;
  const auto need = static_cast<size_t>(shard_tree::scratch_floats(K, n));
  if (scratch.size() < need) scratch.resize(need);
  return scratch.data();
}

bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

// Whether any leaf of a (leaves, n_params) presence table has parameter i.
bool any_leaf_has(const std::vector<uint8_t>& has, size_t n_params, size_t i) {
  for (size_t k = i; k < has.size(); k += n_params)
    if (has[k]) return true;
  return false;
}

// out[0, n) = the shard tree's sum over K leaves of the flattened parameters'
// range [b, b + n), parameter by parameter (their presence differs), in
// blocks of `block` on the threads. leaf(k, i, at): leaf k's values from
// flattened position `at` (inside parameter i) on, or null when it has no
// gradient for parameter i.
template <class Leaf>
void sum_range(const std::vector<int64_t>& offset, int64_t b, int64_t n, int64_t K, int64_t block, const Leaf& leaf,
               Scalar* out) {
  std::vector<int64_t> length, at;  // each piece of a parameter inside the range, and where it starts in it
  std::vector<size_t> param;
  for (size_t i = 0; i + 1 < offset.size(); ++i) {
    const int64_t lo = std::max(b, offset[i]), hi = std::min(b + n, offset[i + 1]);
    if (lo >= hi) continue;
    length.push_back(hi - lo);
    at.push_back(lo - b);
    param.push_back(i);
  }
  parallel::for_each_block(length, block, [&](size_t s, int64_t b0, int64_t e0) {
    const size_t i = param[s];
    const int64_t from = at[s] + b0;
    Scalar* to = out + from;
    std::fill(to, to + (e0 - b0), 0.0f);  // (a parameter no leaf has stays zero, never read)
    shard_tree::sum(0, K, [&](int64_t k) { return leaf(k, i, b + from); }, to, e0 - b0, tree_scratch(K, e0 - b0));
  });
}

// The flattened range [b, e) of the parameters' gradients (zeros where one
// has none) into to[b, e); a gradient already there stays put.
void pack_gradients(const NamedVars& params, const std::vector<int64_t>& offset, int64_t b, int64_t e, Scalar* to) {
  parallel::parallel_for(static_cast<int64_t>(params.size()), 1, [&](int64_t i0, int64_t i1) {
    for (auto i = static_cast<size_t>(i0); i < static_cast<size_t>(i1); ++i) {
      const int64_t lo = std::max(b, offset[i]), hi = std::min(e, offset[i + 1]);
      if (lo >= hi) continue;
      const Var& v = params[i].second;
      if (!v.has_grad()) {
        std::fill(to + lo, to + hi, 0.0f);
        continue;
      }
      const Scalar* g = v.dense_grad().data() + (lo - offset[i]);
      if (g != to + lo) std::copy(g, g + (hi - lo), to + lo);
    }
  });
}

// Each parameter some leaf has a gradient for gets the view of `sums` (the
// flattened parameters' summed gradients) at its offset as its gradient.
void gradients_as_views(const NamedVars& params, const std::vector<int64_t>& offset, const std::vector<uint8_t>& has,
                        const std::shared_ptr<Storage>& sums) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (!any_leaf_has(has, params.size(), i)) continue;
    const Var& p = params[i].second;
    if (p.has_grad() && p.dense_grad().data() == sums->data() + offset[i]) continue;  // already a view of it
    p.node()->grad = Tensor::over(sums, p.shape(), offset[i]);
  }
}

}  // namespace

// The gradient of every shard of every rank, summed per element in the
// shard tree's order (train/shard_tree.h), so N ranks x S shards give the
// bits of one process with N * S shards.
//
// The parameters, flattened, are cut into one chunk per rank. With S a power
// of two a rank's shards are a subtree: it sums them itself (as
// reduce_gradients does) and exchange_partials combines the ranks' partials:
// per step a rank sends P * (N - 1) / N floats twice, whatever S is, what a
// ring all-reduce moves. With another S the shards of a rank are not a
// subtree: each shard's chunk q goes to rank q (one alltoall, S times the
// floats), rank q sums its chunk over all N * S shards in the tree's order,
// and an allgather gives every rank the sums.
void DataParallel::reduce_across_processes(const std::vector<LanguageModel*>& models) {
  {  // every rank here first, so the exchange's time is the exchange's, not the slowest rank's
    const profile::Scope timed("waiting for ranks", profile::Kind::Phase);
    group_->max(0);
  }
  const bool subtree = is_power_of_two(static_cast<int64_t>(models.size()));
  if (subtree) {
    reduce_gradients();  // this rank's partial, in the model's gradients
    exchange_partials();
    return;
  }
  const profile::Scope timed("all-reduce", profile::Kind::Phase);
  const NamedVars params = model_.named_parameters();
  const size_t n_params = params.size(), S = models.size();
  const int N = group_->size(), me = group_->rank();
  std::vector<NamedVars> theirs;
  for (LanguageModel* m : models) theirs.push_back(m->named_parameters());
  std::vector<int64_t> offset(n_params + 1, 0);
  for (size_t i = 0; i < n_params; ++i) offset[i + 1] = offset[i] + params[i].second.numel();
  const int64_t P = offset[n_params];
  const auto chunk = [&](int q) { return P * q / N; };  // chunk q = [chunk(q), chunk(q + 1))

  // Which shards have a gradient for which parameter, every rank's in shard order.
  std::vector<uint8_t> has(S * n_params);
  for (size_t j = 0; j < S; ++j)
    for (size_t i = 0; i < n_params; ++i) has[j * n_params + i] = theirs[j][i].second.has_grad() ? 1 : 0;
  const std::vector<uint8_t> has_all = allgather_equal(*group_, has);
  const size_t K = has_all.size() / n_params;

  // Send: for each rank q, each shard's values of chunk q (zeros where absent).
  std::vector<Scalar>& send = exchange_.send;  // kept between steps: fresh pages would fault in every step
  send.resize(static_cast<size_t>(P) * S);
  std::vector<int64_t> send_bytes(static_cast<size_t>(N)), recv_bytes(static_cast<size_t>(N));
  Scalar* out = send.data();
  for (int q = 0; q < N; ++q) {
    const int64_t b = chunk(q), e = chunk(q + 1);
    for (size_t j = 0; j < S; ++j) {
      for (size_t i = 0; i < n_params; ++i) {
        const int64_t lo = std::max(b, offset[i]), hi = std::min(e, offset[i + 1]);
        if (lo >= hi) continue;
        const Var& v = theirs[j][i].second;
        if (v.has_grad()) {
          const Scalar* g = v.dense_grad().data();
          std::copy(g + (lo - offset[i]), g + (hi - offset[i]), out);
        } else {
          std::fill(out, out + (hi - lo), 0.0f);
        }
        out += hi - lo;
      }
    }
    send_bytes[static_cast<size_t>(q)] = static_cast<int64_t>(S) * (e - b) * static_cast<int64_t>(sizeof(Scalar));
  }
  const int64_t mine_b = chunk(me), mine_n = chunk(me + 1) - mine_b;
  for (int r = 0; r < N; ++r) recv_bytes[static_cast<size_t>(r)] = static_cast<int64_t>(S) * mine_n * sizeof(Scalar);
  std::vector<Scalar>& recv = exchange_.recv;  // shard k's values of my chunk at k * mine_n
  recv.resize(static_cast<size_t>(mine_n) * K);
  group_->alltoall(send.data(), send_bytes, recv.data(), recv_bytes);

  // Sum my chunk over the leaves in the tree's order.
  std::vector<Scalar>& sums = exchange_.sums;
  sums.resize(static_cast<size_t>(mine_n));
  sum_range(offset, mine_b, mine_n, static_cast<int64_t>(K), kReduceBlock,
            [&](int64_t k, size_t i, int64_t at) -> const Scalar* {
    return has_all[static_cast<size_t>(k) * n_params + i] ? recv.data() + k * mine_n + (at - mine_b) : nullptr;
  }, sums.data());

  // Every rank's sums, into the model's gradients.
  std::vector<int64_t> chunk_bytes(static_cast<size_t>(N));
  for (int q = 0; q < N; ++q) chunk_bytes[static_cast<size_t>(q)] = (chunk(q + 1) - chunk(q)) * sizeof(Scalar);
  std::vector<Scalar>& total = exchange_.total;
  total.resize(static_cast<size_t>(P));
  group_->allgather(sums.data(), mine_n * static_cast<int64_t>(sizeof(Scalar)), total.data(), chunk_bytes);
  for (size_t i = 0; i < n_params; ++i) {
    const Var& p = params[i].second;
    if (!any_leaf_has(has_all, n_params, i)) continue;
    if (!p.has_grad()) p.node()->grad = Tensor::empty(p.shape());
    Tensor& g = p.dense_grad();
    std::copy(total.data() + offset[i], total.data() + offset[i + 1], g.data());
  }
  for (size_t j = 0; j < S; ++j)
    if (models[j] != &model_)
      for (const auto& named : theirs[j]) named.second.zero_grad();
}

// Each rank's partial sum (its shards' subtree) combined over the ranks in
// the top of the shard tree. The partials are packed into one flat buffer
// that the exchange works in place on: rank q's chunk goes to rank q, rank
// q combines the N partials of its chunk,
// and the allgather writes every chunk's sum back into the buffer, whose
// pieces then become the parameters' gradients (views, not copies) until
// the optimizer drops them.
void DataParallel::exchange_partials() {
  const profile::Scope timed("all-reduce", profile::Kind::Phase);
  const NamedVars params = model_.named_parameters();
  const size_t n_params = params.size();
  const int N = group_->size(), me = group_->rank();
  std::vector<int64_t> offset(n_params + 1, 0);
  for (size_t i = 0; i < n_params; ++i) offset[i + 1] = offset[i] + params[i].second.numel();
  const int64_t P = offset[n_params];
  const auto chunk = [&](int q) { return P * q / N; };  // chunk q = [chunk(q), chunk(q + 1))

  // All ranks on one machine: through memory they share, with no copy by MPI.
  // A rank's segment of the partials: its partial (P), then which parameters
  // it has a gradient for (n_params floats, 0 or 1).
  if (exchange_.shared_floats != P) {  // (collective: every rank gets here in the same step)
    const auto segment = P + static_cast<int64_t>(n_params);
    exchange_.partials = group_->share_floats(std::vector<int64_t>(static_cast<size_t>(N), segment));
    std::vector<int64_t> chunks;
    for (int q = 0; q < N; ++q) chunks.push_back(chunk(q + 1) - chunk(q));
    exchange_.totals = exchange_.partials ? group_->share_floats(chunks) : nullptr;
    exchange_.shared_floats = P;
  }
  if (exchange_.partials && exchange_.totals) {
    exchange_shared(params, offset);
    return;
  }

  // Which ranks have a partial for which parameter.
  std::vector<uint8_t> has(n_params);
  for (size_t i = 0; i < n_params; ++i) has[i] = params[i].second.has_grad() ? 1 : 0;
  const std::vector<uint8_t> has_all = allgather_equal(*group_, has);

  // Pack (a gradient already in the buffer, an earlier micro-batch's view, stays put).
  Tensor& flat = exchange_.flat;
  if (!flat.defined() || flat.numel() != P) flat = Tensor::empty({P});
  Scalar* base = flat.data();
  pack_gradients(params, offset, 0, P, base);

  // Chunk q of every other rank's partial to rank q.
  const int64_t mine_b = chunk(me), mine_n = chunk(me + 1) - mine_b;
  std::vector<int64_t> send_bytes(static_cast<size_t>(N)), recv_bytes(static_cast<size_t>(N));
  for (int q = 0; q < N; ++q) {
    send_bytes[static_cast<size_t>(q)] = (chunk(q + 1) - chunk(q)) * static_cast<int64_t>(sizeof(Scalar));
    recv_bytes[static_cast<size_t>(q)] = mine_n * static_cast<int64_t>(sizeof(Scalar));
  }
  std::vector<Scalar>& recv = exchange_.recv;  // rank r's values of my chunk at r * mine_n
  recv.resize(static_cast<size_t>(mine_n) * static_cast<size_t>(N));
  group_->alltoall(base, send_bytes, recv.data(), recv_bytes);

  // My chunk's sums over the ranks in the tree's order.
  std::vector<Scalar>& sums = exchange_.sums;
  sums.resize(static_cast<size_t>(mine_n));
  sum_range(offset, mine_b, mine_n, N, kReduceBlock, [&](int64_t r, size_t i, int64_t at) -> const Scalar* {
    return has_all[static_cast<size_t>(r) * n_params + i] ? recv.data() + r * mine_n + (at - mine_b) : nullptr;
  }, sums.data());

  // Every rank's sums into the buffer, whose pieces become the gradients.
  std::vector<int64_t> chunk_bytes(static_cast<size_t>(N));
  for (int q = 0; q < N; ++q) chunk_bytes[static_cast<size_t>(q)] = (chunk(q + 1) - chunk(q)) * sizeof(Scalar);
  group_->allgather(sums.data(), mine_n * static_cast<int64_t>(sizeof(Scalar)), base, chunk_bytes);
  gradients_as_views(params, offset, has_all, flat.storage());
}

// exchange_partials through shared memory: each rank writes the chunks of
// its partial the other ranks sum into its segment, then sums its own chunk
// over every rank's partial in the tree's order (its own read from its
// gradients) into its segment of the totals, which the gradients then read
// in place. Two barriers; nothing goes through MPI's buffers.
void DataParallel::exchange_shared(const NamedVars& params, const std::vector<int64_t>& offset) {
  const size_t n_params = params.size();
  const int N = group_->size(), me = group_->rank();
  const int64_t P = offset[n_params];
  const auto chunk = [&](int q) { return P * q / N; };
  const int64_t mine_b = chunk(me), mine_e = chunk(me + 1);
  ProcessGroup::SharedFloats& partials = *exchange_.partials;
  ProcessGroup::SharedFloats& totals = *exchange_.totals;
  // My gradients still views of the last step's totals (an earlier
  // micro-batch's, on rank 0) would be overwritten by the sum they feed: the
  // whole partial goes to my segment then.
  bool in_totals = false;
  if (exchange_.shared_totals)
    for (const auto& [name, p] : params)
      in_totals = in_totals || (p.has_grad() && p.grad().storage() == exchange_.shared_totals);
  Scalar* segment = partials.segment(me);
  pack_gradients(params, offset, 0, mine_b, segment);
  pack_gradients(params, offset, mine_e, P, segment);
  if (in_totals) pack_gradients(params, offset, mine_b, mine_e, segment);
  for (size_t i = 0; i < n_params; ++i) segment[P + static_cast<int64_t>(i)] = params[i].second.has_grad() ? 1.0f : 0.0f;
  profile::add_bytes_sent(2 * (P - (mine_e - mine_b)) * static_cast<int64_t>(sizeof(Scalar)));
  partials.sync();  // every partial written

  std::vector<uint8_t> has_all(static_cast<size_t>(N) * n_params);  // (ranks, n_params)
  for (int r = 0; r < N; ++r)
    for (size_t i = 0; i < n_params; ++i)
      has_all[static_cast<size_t>(r) * n_params + i] = partials.segment(r)[P + static_cast<int64_t>(i)] != 0.0f;

  sum_range(offset, mine_b, mine_e - mine_b, N, kReduceBlock, [&](int64_t r, size_t i, int64_t at) -> const Scalar* {
    if (!has_all[static_cast<size_t>(r) * n_params + i]) return nullptr;
    if (r == me && !in_totals) return params[i].second.dense_grad().data() + (at - offset[i]);
    return partials.segment(static_cast<int>(r)) + at;
  }, totals.segment(me));  // my chunk of the totals
  totals.sync();  // every chunk summed

  // The gradients become views of the shared totals, which are one array of
  // P floats when the window's segments lie end to end (MPI's default). Every
  // rank only reads them until the next exchange's first barrier. A model
  // with an auxiliary loss of its parameters adds it into its gradients
  // after the exchange, on every rank: it gets a private copy instead.
  if (!exchange_.model_has_auxiliary) exchange_.model_has_auxiliary = model_.auxiliary_loss(false).defined();
  bool contiguous = true;
  for (int q = 0; q < N; ++q) contiguous = contiguous && totals.segment(q) == totals.segment(0) + chunk(q);
  if (contiguous && !*exchange_.model_has_auxiliary) {
    if (!exchange_.shared_totals) exchange_.shared_totals = Storage::borrow(totals.segment(0), P);
    gradients_as_views(params, offset, has_all, exchange_.shared_totals);
    return;
  }

  Tensor& flat = exchange_.flat;
  if (!flat.defined() || flat.numel() != P) flat = Tensor::empty({P});
  for (int q = 0; q < N; ++q)
    std::copy(totals.segment(q), totals.segment(q) + (chunk(q + 1) - chunk(q)), flat.data() + chunk(q));
  gradients_as_views(params, offset, has_all, flat.storage());
}

// Layers' auxiliary losses (adaptive span's penalty) once per batch, on the
// model itself: they depend on parameters only, not on the batch's rows.
// The returned loss stays the cross-entropy alone.
void DataParallel::backward_auxiliary(float scale) {
  if (!grad_enabled()) return;
  const Var aux = model_.auxiliary_loss(/*of_batch=*/false);
  if (aux.defined()) backward(mul_scalar(aux, scale));
}

// What one backward pass takes: the scaled LM loss, plus the auxiliary
// losses of the batch the shard's model just read (the learned
// compression's attention reconstruction) scaled alike; the tape holds both
// graphs until that pass.
Var DataParallel::with_batch_losses(const Var& scaled_loss, const LanguageModel& model, float scale) {
  const Var aux = model.auxiliary_loss(/*of_batch=*/true);
  if (!aux.defined()) return scaled_loss;
  return add(scaled_loss, mul_scalar(aux, scale));
}

// Replica gradients into the model's, in the shard tree's order
// (train/shard_tree.h), in one parallel pass over fixed blocks: the same
// sums for any thread count.
void DataParallel::reduce_gradients() {
  const profile::Scope timed("gradient reduction", profile::Kind::Phase);
  if (replicas_.empty()) return;
  const NamedVars params = model_.named_parameters();
  std::vector<NamedVars> theirs;
  for (const auto& replica : replicas_) theirs.push_back(replica->named_parameters());
  const int64_t K = static_cast<int64_t>(theirs.size()) + 1;
  std::vector<std::vector<const Scalar*>> leaves(params.size());  // shard k's gradient (null: none)
  std::vector<int64_t> sizes(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    const Var& p = params[i].second;
    bool any = false;
    for (const NamedVars& r : theirs) any = any || r[i].second.has_grad();
    if (!any) continue;
    const bool own = p.has_grad();
    if (!own) p.node()->grad = Tensor::empty(p.shape());
    leaves[i].push_back(own ? p.dense_grad().data() : nullptr);
    for (const NamedVars& r : theirs) leaves[i].push_back(r[i].second.has_grad() ? r[i].second.dense_grad().data() : nullptr);
    sizes[i] = p.numel();
  }
  parallel::for_each_block(sizes, kReduceBlock, [&](size_t i, int64_t b, int64_t e) {
    Scalar* out = params[i].second.dense_grad().data() + b;
    const auto leaf = [&](int64_t k) -> const Scalar* {
      const Scalar* g = leaves[i][static_cast<size_t>(k)];
      return g == nullptr ? nullptr : g + b;
    };
    shard_tree::sum(0, K, leaf, out, e - b, tree_scratch(K, e - b));
  });
  for (const NamedVars& r : theirs)
    for (const auto& named : r) named.second.zero_grad();
}

std::vector<double> DataParallel::losses(const std::vector<Batch>& batches, Rng& rng) const {
  TAPEFORMER_CHECK(!model_.is_training(), "DataParallel::losses: put the model in eval mode first");
  // With several processes, each takes a consecutive share of the batches.
  const int64_t n = static_cast<int64_t>(batches.size()), N = group_ ? group_->size() : 1;
  const int64_t me = group_ ? group_->rank() : 0, lo = n * me / N, hi = n * (me + 1) / N;
  std::vector<double> out(static_cast<size_t>(hi - lo));
  parallel::parallel_for(hi - lo, 1, [&](int64_t b0, int64_t b1) {
    NoGradGuard no_grad;  // per thread
    Rng local = rng;      // eval mode: dropout is off and draws nothing
    for (int64_t i = b0; i < b1; ++i) {
      const Batch& b = batches[static_cast<size_t>(lo + i)];
      ModelContext ctx;
      ctx.rng = &local;
      ctx.inputs = b.extra.empty() ? nullptr : &b.extra;
      const Var logits = model_.forward(b.inputs, ctx);  // (B, T, V)
      out[static_cast<size_t>(i)] = cross_entropy(logits, b.targets).item();
    }
  });
  if (!group_) return out;
  std::vector<int64_t> bytes(static_cast<size_t>(N));
  for (int64_t r = 0; r < N; ++r) bytes[static_cast<size_t>(r)] = (n * (r + 1) / N - n * r / N) * sizeof(double);
  std::vector<double> all(static_cast<size_t>(n));
  group_->allgather(out.data(), static_cast<int64_t>(out.size() * sizeof(double)), all.data(), bytes);
  return all;
}

}  // namespace tapeformer
