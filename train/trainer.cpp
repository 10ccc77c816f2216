#include "tapeformer/train/trainer.h"

#include <cereal/types/array.hpp>
#include <cereal/types/vector.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>


#include "tapeformer/core/error.h"
#include "tapeformer/core/kernels/precision.h"
#include "tapeformer/core/files.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/serialize.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/data/dataset.h"
#include "tapeformer/data/token_file.h"
#include "tapeformer/data/sampler.h"
#include "tapeformer/data/tokenizer.h"
#include "tapeformer/train/build.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/data_parallel.h"
#include "tapeformer/train/footprint.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/process_group.h"
#include "tapeformer/train/profile_report.h"
#include "tapeformer/train/rank_checks.h"
#include "tapeformer/train/run_lock.h"
#include "tapeformer/train/signals.h"
#include "tapeformer/train/evaluator.h"
#include "tapeformer/train/model_hooks.h"
#include "tapeformer/train/run_directory.h"
#include "tapeformer/train/save_guard.h"
#include "tapeformer/train/stream_state.h"

namespace tapeformer {
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Helpers: timing, stream seeds.

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "step N: train loss L, val loss V": the progress note of an evaluation step.
std::string evaluation_note(const MetricsRecord& r) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "step %lld: train loss %.4f, val loss %.4f", static_cast<long long>(r.step),
                r.train_loss, r.val_loss.value_or(NAN));
  return buf;
}



}  // namespace


Diverged::Diverged(const std::string& message, int64_t step, double train_seconds)
    : Error(message), step_(step), train_seconds_(train_seconds) {}

// ---------------------------------------------------------------------------

struct Trainer::State {
  TrainConfig cfg;
  std::string out_dir;
  std::unique_ptr<Tokenizer> tokenizer;  // none for a task
  TaskData task;                         // a program's task; no batches for a corpus run
  std::unique_ptr<TextCorpus> corpus;  // a text file's ids, in memory; or none, with token files
  std::unique_ptr<TokenSource> train_tokens, val_tokens;  // the splits the samplers read
  double val_tokens_per_char = 1;                         // turns nats per token into bits per character
  std::unique_ptr<LanguageModel> model;
  std::shared_ptr<ProcessGroup> group;  // the ranks of an mpirun job; null: one process
  std::optional<kernels::ProductPrecision> precision;  // train.precision, while the Trainer lives
  std::unique_ptr<DataParallel> shards;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<Schedule> schedule;
  std::unique_ptr<RandomWindowSampler> train_batches;  // random windows; or, with a segment memory,
  std::unique_ptr<StreamSampler> train_streams;        // consecutive segments of B streams
  SegmentMemory train_memory;                          // carried from step to step (Transformer-XL)
  HookSite site;                                       // where the hooks were made
  std::unique_ptr<ModelHooks> hooks;                   // the model kind's (train/model_hooks.h)
  BatchSource* train_source_ = nullptr;                // what the loop reads: the batches, through the hooks
  std::vector<Batch> val_batches, final_batches;
  Rng dropout_rng;
  int64_t step = 0;
  double train_seconds = 0;
  double last_train_loss = NAN;  // mean loss of the latest step (from the checkpoint on resume)
  bool eval_pending = false;     // a signal stopped the evaluation of step `step` (saved with it)
  Batch last_batch;              // the latest step's last micro-batch: the probe before a save
  std::unique_ptr<RunDirectory> dir;  // rank 0 writes it
  bool resumed = false;
  bool profile = false;
  bool quiet = false;

  // Rank 0 writes the run directory (metrics, checkpoints, profile) and
  // prints; the other ranks of a distributed run only compute.
  bool writes() const { return !group || group->rank() == 0; }
  // A fresh run's directory, claimed after the build (so a run refused for
  // its data or config leaves none behind), with the files the hooks keep.
  void claim_run_directory() {
    keep_files(/*claim=*/true);
  }
  // The files the model kind keeps in the run's directory: claimed with the
  // directory (a fresh run) or their stale temp files cleared (a resumed
  // one), then written by rank 0.
  void keep_files(bool claim) {
    const std::vector<KeptFile> kept = hooks->kept_files(out_dir);
    std::vector<std::string> paths;
    for (const KeptFile& k : kept) paths.push_back(k.path);
    if (claim) {
      dir->claim(paths);
    } else {
      dir->remove_stale_temp_files(paths);
    }
    if (writes())
      for (const KeptFile& k : kept) k.write();
  }

  bool is_task() const { return task.batches != nullptr; }
  // A segment memory is carried from step to step.
  bool carries_memory() const { return model->memory_use().carried(); }

  // Builds everything from cfg (and a tokenizer, when resuming).
  void build(std::unique_ptr<Tokenizer> tok) {
    start_process();
    TrainingData data = load_training_data(cfg.data.path, cfg.data.tokenizer_options(), cfg.data.val_fraction,
                                           cfg.data.vocab_size, std::move(tok));
    tokenizer = std::move(data.tokenizer);
    corpus = std::move(data.corpus);
    train_tokens = std::move(data.train);
    val_tokens = std::move(data.val);
    val_tokens_per_char = data.val_tokens_per_char;
    cfg.model.vocab_size = tokenizer->vocab_size();
    const int64_t B = cfg.train.batch_size, T = cfg.model.block_size;
    // What needs no model first: the model's build measures a forward over
    // one block, which a block longer than the data makes long.
    RandomWindowSampler(*train_tokens, B, T, 0, "train split");
    RandomWindowSampler(*val_tokens, B, T, 0, "val split");
    build_model(save_tokenizer(*tokenizer));
    TAPEFORMER_CHECK(cfg.data.align == 1 || !carries_memory(), "data.align ", cfg.data.align,
                     " does not combine with a segment memory (model.mem_len): its segments follow the text in order");
    if (carries_memory()) {
      // Segments in order, so each row's memory holds what came just before it;
      // evaluation reads the val split's streams from their starts.
      train_streams =
          std::make_unique<StreamSampler>(*train_tokens, B, T, "train split", model->memory_use().ext_len);
      StreamSampler(*val_tokens, B, T, "val split");  // refuses a val split too short for one segment
    } else {
      const int64_t align = cfg.data.align;
      // Records of `align` tokens: the val split must start at one.
      TAPEFORMER_CHECK(train_tokens->size() % align == 0, "data.align ", align, ": the train split has ",
                       train_tokens->size(), " tokens, not whole records of ", align,
                       ", so the val split would start inside one (set data.val_fraction so the split falls "
                       "between records)");
      train_batches = std::make_unique<RandomWindowSampler>(
          *train_tokens, B, T, stream_seed(cfg.train.seed, Stream::train_batches), "train split", align);
      RandomWindowSampler val(*val_tokens, B, T, stream_seed(cfg.train.seed, Stream::val_batches), "val split", align);
      for (int64_t i = 0; i < cfg.eval.iters; ++i) val_batches.push_back(val.next());
      RandomWindowSampler fin(*val_tokens, B, T, stream_seed(cfg.train.seed, Stream::final_batches), "val split", align);
      for (int64_t i = 0; i < cfg.eval.final_iters; ++i) final_batches.push_back(fin.next());
    }
    site.cfg = &cfg;
    site.tokenizer = tokenizer.get();
    site.train = train_tokens.get();
    site.val = val_tokens.get();
    site.run_dir = out_dir;
    hooks = make_model_hooks(site);
    BatchSource& inner = train_streams ? static_cast<BatchSource&>(*train_streams) : *train_batches;
    BatchSource* wrapped = hooks->batches(inner, /*eval=*/false);
    train_source_ = wrapped ? wrapped : &inner;
    dropout_rng = Rng(stream_seed(cfg.train.seed, Stream::dropout));
  }

  // Builds a task's run from cfg and `task`.
  void build_task() {
    TAPEFORMER_CHECK(task.evaluate, task.name, ": a task needs an evaluation (TaskData::evaluate)");
    TAPEFORMER_CHECK(task.vocab_size >= 1, task.name, ": a task's vocabulary must hold a token, got ", task.vocab_size);
    TAPEFORMER_CHECK(task.warmup_batches >= 0, task.name, ": warmup_batches must be >= 0, got ", task.warmup_batches);
    start_process();
    cfg.model.vocab_size = task.vocab_size;
    build_model(task.name);
    site.cfg = &cfg;
    site.task = task.name;
    hooks = make_model_hooks(site);
    BatchSource* wrapped = hooks->batches(*task.batches, /*eval=*/false);
    train_source_ = wrapped ? wrapped : task.batches.get();
    dropout_rng = Rng(task.dropout_seed ? *task.dropout_seed : stream_seed(cfg.train.seed, Stream::dropout));
  }

  void start_process() {
    // The products of the whole run (core/kernels/precision.h): its memory
    // measure, steps and evaluations. bf16 on a CPU without the instructions
    // is refused here, before anything is built.
    if (cfg.train.precision == "bf16") {
      const std::string why = kernels::bf16_unsupported();
      TAPEFORMER_CHECK(why.empty(), "config: ", why);
    }
    precision.emplace(cfg.train.precision == "bf16"            ? kernels::Precision::bf16
                      : cfg.train.precision == "bf16_portable" ? kernels::Precision::bf16_portable
                                                               : kernels::Precision::fp32);
    parallel::set_num_threads(static_cast<int>(cfg.train.threads));
    Storage::keep_freed_memory_mapped();
    group = ProcessGroup::world();
  }

  // The model, its optimizer, shards and schedule; `data` identifies the
  // data for the check that every rank runs the same.
  void build_model(const std::string& data) {
    const int64_t num_shards = shard_count(cfg);
    check_fits_in_memory(cfg, num_shards);  // before anything is allocated
    // A long block's floor, from a small model of the same kinds: refused before the model is built.
    if (const std::optional<double> floor = activation_floats_floor(cfg.model, cfg.train.recompute_every()))
      check_fits_in_memory(cfg, num_shards, floor);
    Rng init(stream_seed(cfg.train.seed, Stream::init));
    model = make_model(cfg.model, init);
    model->set_recompute(cfg.train.recompute_every());  // before the measurement and the shards' replicas
    check_fits_in_memory(cfg, num_shards, activation_floats(*model));  // before the optimizer's moments and any batch
    optimizer = make_optimizer(cfg.optimizer, model->named_parameters());
    shards = std::make_unique<DataParallel>(*model, static_cast<int>(num_shards), group);
    if (group) check_same_run_on_every_rank(data);
    schedule = make_schedule(cfg);
  }

  // A task's first batches, read forward only to fill the segment memory.
  void warm_up() {
    NoGradGuard no_grad;
    for (int64_t i = 0; i < task.warmup_batches; ++i)
      shards->train_batch(next_train_batch(), 1.0f, dropout_rng, carries_memory() ? &train_memory : nullptr);
  }

  // Every rank must train the same run (train/rank_checks.h), and refuses
  // more shards than rows.
  void check_same_run_on_every_rank(const std::string& data) {
    check_same_run(*group, cfg.to_json() + "\n" + data, shards->shards());
    shards->total_shards(cfg.train.batch_size);  // refuses more shards than rows, naming both
  }

  // Every rank must start from the same state (train/rank_checks.h).
  void check_same_state_on_every_rank(int64_t start_step, uint64_t checkpoint_hash) {
    if (group) check_same_state(*group, start_step, checkpoint_hash, {train_tokens.get(), val_tokens.get()}, cfg.data.path);
  }

  // Mean loss of the first `segments` segments of the val split's streams (at
  // most one pass), read in order with a fresh memory of eval.mem_len
  // (default model.mem_len) positions.
  double evaluate_streams(int64_t segments) {
    StreamSampler streams(*val_tokens, cfg.train.batch_size, cfg.model.block_size, "val split",
                          model->memory_use().ext_len);
    const int64_t n = std::min(segments, streams.segments());
    model->eval();
    // eval mode draws no masks; the training stream stays untouched (a copy)
    const double loss = Evaluator(*model, {hooks.get()}).stream_loss(*shards, streams, n, cfg.eval.mem_len, dropout_rng);
    model->train();
    return loss;
  }

  TaskEvaluation evaluate_task(bool final) {
    model->eval();
    TaskEvaluation e;
    {
      NoGradGuard no_grad;
      e = task.evaluate(*model, final);
    }
    model->train();
    return e;
  }

  TaskEvaluation evaluate_periodic() {
    if (is_task()) return evaluate_task(false);
    return {train_streams ? evaluate_streams(cfg.eval.iters) : evaluate(val_batches), {}};
  }
  TaskEvaluation evaluate_final() {
    if (is_task()) return evaluate_task(true);
    return {train_streams ? evaluate_streams(cfg.eval.final_iters) : evaluate(final_batches), {}};
  }

  // A task's batches, random windows, or a memory run's ordered streams, through the hooks.
  BatchSource& train_source() const { return *train_source_; }

  Batch next_train_batch() {
    Batch b = train_source().next();
    if (train_source().restarted()) train_memory.reset();  // the data starts over: nothing came before
    return b;
  }

  StreamState stream_state() {
    return StreamState{&train_source(), &train_memory, cfg.train.batch_size, model->memory_use().groups};
  }

  double evaluate(const std::vector<Batch>& batches) {
    model->eval();
    const double loss = Evaluator(*model, {hooks.get()}).batches_loss(*shards, batches, dropout_rng);
    model->train();
    return loss;
  }

  // The periodic evaluation's figures, into the metrics line of its step.
  void evaluate_into(MetricsRecord& r) {
    TaskEvaluation e = evaluate_periodic();
    r.val_loss = e.loss;
    if (!is_task()) r.val_bpc = e.loss / std::log(2.0) * val_tokens_per_char;
    r.layers = model->layer_metrics();
    r.extra = std::move(e.fields);
  }

  // A signal stopped the evaluation of the checkpoint's step: evaluate it
  // now and complete that step's metrics line (written without its val
  // loss), so the metrics are those of an uninterrupted run. Called before
  // the metrics log opens: the line is rewritten in place.
  void finish_pending_evaluation(Progress& progress) {
    MetricsRecord r;
    r.step = step;
    r.train_loss = last_train_loss;
    if (writes())
      for (const MetricsRecord& line : read_metrics(dir->metrics_path()))
        if (line.step == step) r = line;
    try {
      evaluate_into(r);
    } catch (const Interrupted& stopped) {  // the checkpoint on disk still says pending
      throw Interrupted(std::string(stopped.what()) + " while evaluating step " + std::to_string(step) +
                            "; continue with: " + program_name() + " train --out " + out_dir + " --resume",
                        stopped.signal());
    }
    model->train();
    eval_pending = false;
    if (writes()) {
      dir->trim_metrics_after(step - 1);
      MetricsLog(dir->metrics_path(), /*append=*/true).write(r);
    }
    progress.note(evaluation_note(r));
  }

  // Every rank calls it at the same steps; rank 0 writes. Weights that
  // cannot be saved (train/save_guard.h) end the run on every rank as diverged, and
  // the checkpoint on disk stays.
  void save(double loss) {
    std::string why = unsaveable(loss, *model, *optimizer, last_batch, dropout_rng);
    if (group && group->max(why.empty() ? 0 : 1) != 0 && why.empty()) why = "another rank's weights are not usable";
    if (!why.empty())
      throw Diverged("training diverged: " + why + " after step " + std::to_string(step) + dir->checkpoint_note() +
                         " (lower optimizer.lr or set optimizer.grad_clip)",
                     step, train_seconds);
    if (!writes()) return;
    Checkpoint c;
    c.config_json = cfg.to_json();
    c.tokenizer = tokenizer ? save_tokenizer(*tokenizer) : std::string();  // empty: a task
    c.model = model->state();
    c.optimizer = optimizer->state_tensors();
    c.optimizer_step = optimizer->step_count();
    c.step = step;
    c.train_seconds = train_seconds;
    c.rng = dropout_rng;
    c.sampler = carries_memory() ? to_bytes(stream_state()) : to_bytes(SourcePosition{&train_source()});
    c.train_loss = loss;
    c.eval_pending = eval_pending;
    dir->save(c, step);
  }

};

Trainer::Trainer(TrainConfig cfg, std::string out_dir) : s_(std::make_unique<State>()) {
  cfg.validate();
  s_->cfg = std::move(cfg);
  s_->out_dir = std::move(out_dir);
  s_->build(nullptr);
  initialise_model(s_->site, *s_->model);  // a fresh run's starting weights, where the model kind gives them
  s_->shards->sync_buffers();
  s_->check_same_state_on_every_rank(0, 0);
  s_->dir = std::make_unique<RunDirectory>(s_->out_dir, s_->writes());
  s_->claim_run_directory();
}

Trainer::Trainer(TrainConfig cfg, std::string out_dir, TaskData task) : s_(std::make_unique<State>()) {
  TAPEFORMER_CHECK(task.batches, "Trainer: a task needs its batches (TaskData::batches)");
  cfg.validate();
  s_->cfg = std::move(cfg);
  s_->out_dir = std::move(out_dir);
  s_->task = std::move(task);
  s_->build_task();
  s_->warm_up();
  s_->dir = std::make_unique<RunDirectory>(s_->out_dir, s_->writes());
  s_->claim_run_directory();
}

Trainer::~Trainer() = default;

std::unique_ptr<Trainer> Trainer::resume(const std::string& out_dir, const std::function<void(TrainConfig&)>& adjust) {
  return resume(out_dir, TaskData{}, adjust);
}

std::unique_ptr<Trainer> Trainer::resume(const std::string& out_dir,
                                         const std::function<void(TrainConfig&, const ResumePoint&)>& adjust) {
  return resume_run(out_dir, TaskData{}, adjust);
}

std::unique_ptr<Trainer> Trainer::resume(const std::string& out_dir, TaskData task,
                                         const std::function<void(TrainConfig&)>& adjust) {
  return resume_run(out_dir, std::move(task), [&](TrainConfig& c, const ResumePoint&) {
    if (adjust) adjust(c);
  });
}

std::unique_ptr<Trainer> Trainer::resume_run(const std::string& out_dir, TaskData task,
                                             const std::function<void(TrainConfig&, const ResumePoint&)>& adjust) {
  std::unique_ptr<Trainer> t(new Trainer());
  t->s_ = std::make_unique<State>();
  State& s = *t->s_;
  s.out_dir = out_dir;
  s.task = std::move(task);
  // Another process still training here would overwrite what this one writes.
  const std::shared_ptr<ProcessGroup> world = ProcessGroup::world();
  s.dir = std::make_unique<RunDirectory>(out_dir, !world || world->rank() == 0);
  s.dir->lock_existing();
  const Checkpoint c = load_checkpoint(s.dir->checkpoint_path());
  const std::string path = "checkpoint '" + s.dir->checkpoint_path() + "'";
  TAPEFORMER_CHECK(!s.is_task() || c.tokenizer.empty(), path, " is a run on a text corpus, not on ", s.task.name,
                   "'s task; resume it with: ", program_name(), " train --out ", out_dir, " --resume");
  s.cfg = TrainConfig::parse(c.config_json, "in " + path);
  TAPEFORMER_CHECK(s.is_task() || !c.tokenizer.empty(), path, " holds no tokenizer, so it cannot resume on a text: it "
                   "was trained on ", task_run_origin(s.cfg.model.arch));
  const ResumePoint point{c.step, c.step > 0 || !c.optimizer.empty()};
  if (adjust) adjust(s.cfg, point);
  TAPEFORMER_CHECK(s.cfg.train.max_iters >= c.step, "cannot resume '", out_dir, "': train.max_iters = ",
                   s.cfg.train.max_iters, " is below the checkpoint's step ", c.step,
                   " (a run does not go back; ask for train.max_iters >= ", c.step, ")");
  if (s.is_task()) {
    s.build_task();
  } else {
    s.build(load_tokenizer(c.tokenizer));
  }
  s.model->load_state(c.model);
  s.shards->sync_buffers();  // the replicas were built before the checkpoint's buffers (FAVOR+ features) loaded
  if (point.started) s.optimizer->load_state(c.optimizer, c.optimizer_step);
  const std::string what = path + ": cannot decode the batch sampler";
  if (!point.started) {
    // Nothing drawn yet: the sampler and the dropout draws are the fresh run's (build set them).
  } else if (s.carries_memory()) {
    StreamState state = s.stream_state();
    state.format = c.version;
    from_bytes(c.sampler, state, what);
  } else {
    SourcePosition position{&s.train_source()};
    from_bytes(c.sampler, position, what);
  }
  s.check_same_state_on_every_rank(c.step, c.checksum);
  if (point.started) s.dropout_rng = c.rng;
  s.last_train_loss = c.train_loss;
  s.eval_pending = c.eval_pending;
  s.dir->set_saved_step(c.step);
  s.step = c.step;
  s.train_seconds = c.train_seconds;
  s.resumed = true;
  s.keep_files(/*claim=*/false);
  const double loss_at_checkpoint = s.dir->trim_metrics_after(s.step);
  if (std::isnan(s.last_train_loss)) s.last_train_loss = loss_at_checkpoint;  // a version 1 checkpoint
  return t;
}

const TrainConfig& Trainer::config() const { return s_->cfg; }
LanguageModel& Trainer::model() { return *s_->model; }
void Trainer::set_profile(bool on) { s_->profile = on; }
void Trainer::set_quiet(bool on) { s_->quiet = on; }

TrainResult Trainer::run() {
  State& s = *s_;
  const TrainConfig& c = s.cfg;
  const int64_t tokens_per_step = c.train.batch_size * c.model.block_size * c.train.grad_accum;
  Progress progress(c.train.max_iters, s.writes() && !s.quiet);
  if (s.resumed) progress.note("resuming at step " + std::to_string(s.step) + " from " + s.dir->checkpoint_path());
  if (s.eval_pending) s.finish_pending_evaluation(progress);
  std::optional<MetricsLog> metrics;
  if (s.writes()) metrics.emplace(s.dir->metrics_path(), /*append=*/s.resumed);
  s.model->train();
  double last_loss = s.last_train_loss, last_norm = 0;
  const StopSignals stop;
  std::unique_ptr<StepProfiler> profiler;
  if (s.profile) profiler = std::make_unique<StepProfiler>();

  while (s.step < c.train.max_iters) {
    const auto t0 = std::chrono::steady_clock::now();
    if (profiler) profiler->begin_step();
    const StepResult step = train_step(c, s.step, *s.shards, s.model->parameters(), *s.optimizer, *s.schedule,
                                       [&] { return s.last_batch = s.next_train_batch(); }, s.dropout_rng,
                                       s.carries_memory() ? &s.train_memory : nullptr);
    if (profiler) profiler->end_step(seconds_since(t0));
    const float lr = step.lr;
    last_loss = step.loss;
    last_norm = step.grad_norm;
    if (!std::isfinite(last_loss) || !std::isfinite(last_norm)) {
      progress.finish();
      std::ostringstream what;
      what << "training diverged: " << (std::isfinite(last_loss) ? "gradient norm" : "loss") << " is "
           << (std::isfinite(last_loss) ? last_norm : last_loss) << " at step " << s.step + 1 << " (lr " << lr << ")"
           << s.dir->checkpoint_note();
      throw Diverged(what.str(), s.step + 1, s.train_seconds);
    }
    ++s.step;
    const double step_seconds = seconds_since(t0);
    s.train_seconds += step_seconds;

    const bool last = s.step == c.train.max_iters;
    int eval_signal = 0;  // a signal that stopped this step's evaluation (every rank agreed)
    const bool eval_now = s.step % c.eval.interval == 0 || last;
    if (s.step % c.log.interval == 0 || eval_now) {
      MetricsRecord r;
      r.step = s.step;
      r.lr = lr;
      r.train_loss = last_loss;
      r.grad_norm = last_norm;
      r.tokens_per_s = static_cast<double>(tokens_per_step) * s.step / s.train_seconds;
      r.elapsed_s = s.train_seconds;
      if (eval_now) {
        try {
          s.evaluate_into(r);
        } catch (const Interrupted& stopped) {  // the step is trained: its checkpoint is saved, its evaluation pending
          s.model->train();
          s.eval_pending = true;
          eval_signal = stopped.signal();
        }
      }
      if (metrics) {
        s.dir->check_held();  // the directory is still this run's
        metrics->write(r);
      }
      progress.update(s.step, last_loss, r.tokens_per_s, s.train_seconds / s.step);
      if (r.val_loss) progress.note(evaluation_note(r));
    }
    // A signal stops every rank after the same step (each may have seen it
    // after a different one).
    int signal = s.group ? static_cast<int>(s.group->max(stop.received())) : stop.received();
    if (signal == 0) signal = eval_signal;
    if (s.step % c.checkpoint.interval == 0 || last) {
      s.save(last_loss);
    } else if (signal != 0) {
      s.save(last_loss);  // nothing is lost: the next run resumes at this very step
    }
    if (signal != 0 && !last) {
      progress.finish();
      throw Interrupted(std::string(signal == SIGINT ? "interrupted (" : "stopped (") + StopSignals::name(signal) + ")" +
                            " at step " + std::to_string(s.step) + ": checkpoint saved to '" + s.dir->checkpoint_path() +
                            "'; continue with: " + program_name() + " train --out " + s.out_dir + " --resume",
                        signal);
    }
  }
  progress.finish();
  if (profiler) {
    const StepProfile p = profiler->finish(parallel::num_threads(), s.shards->shards());
    if (s.writes()) {
      std::fprintf(stderr, "%s", p.table().c_str());
      // A run that timed nothing (resumed at its end, or one step) keeps the profile it has.
      if (p.steps > 0) write_file_atomic(s.out_dir + "/profile.json", p.json());
    }
  }

  TrainResult result;
  result.steps = s.step;
  result.train_loss = last_loss;
  TaskEvaluation final_eval;
  try {
    final_eval = s.evaluate_final();
  } catch (const Interrupted& stopped) {  // the last step's checkpoint is saved: only the evaluation is left
    throw Interrupted(std::string(stopped.what()) + " after step " + std::to_string(s.step) +
                          (s.dir->saved_step() >= 0 ? ": checkpoint saved to '" + s.dir->checkpoint_path() + "'" : "") +
                          "; evaluate it with: " + program_name() + " train --out " + s.out_dir + " --resume",
                      stopped.signal());
  }
  result.val_loss = final_eval.loss;
  result.val_fields = std::move(final_eval.fields);
  result.val_tokens_per_char = s.val_tokens_per_char;
  result.train_seconds = s.train_seconds;
  result.tokens_per_s = s.train_seconds > 0 ? static_cast<double>(tokens_per_step) * s.step / s.train_seconds : 0;
  result.parameters = s.model->num_parameters();
  result.shards = static_cast<int>(s.shards->total_shards(c.train.batch_size));
  result.ranks = s.group ? s.group->size() : 1;
  return result;
}

double TrainResult::val_bpc() const { return val_loss / std::log(2.0) * val_tokens_per_char; }

std::string TrainResult::to_json() const {
  // null for what JSON cannot hold: a loss unknown after a version 1
  // checkpoint, a perplexity that overflows.
  char buf[2048];  // four numbers of up to 320 characters each, and the rest
  std::snprintf(buf, sizeof buf,
                "{\"impl\": \"tapeformer\", \"steps\": %lld, \"train_loss\": %s, \"val_loss\": %s, "
                "\"val_bpc\": %s, \"val_perplexity\": %s, "
                "\"train_seconds\": %.3f, \"tokens_per_s\": %.1f, \"threads\": %d, \"ranks\": %d, \"shards\": %d, "
                "\"params\": %lld}",
                static_cast<long long>(steps), json_fixed(train_loss, 6).c_str(), json_fixed(val_loss, 6).c_str(),
                json_fixed(val_bpc(), 6).c_str(), json_fixed(std::exp(val_loss), 4).c_str(), train_seconds, tokens_per_s,
                parallel::num_threads(), ranks, shards, static_cast<long long>(parameters));
  return buf;
}

}  // namespace tapeformer
