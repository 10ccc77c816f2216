// Metrics as JSON lines, and the live progress on stderr: training's
// (Progress) and that of any other long work (WorkProgress), both on one
// StatusLine.
//
//   MetricsLog log(out_dir + "/metrics.jsonl", /*append=*/resuming);
//   log.write({.step = 10, .lr = 1e-3, ...});
//   Progress progress(total_steps);          // tty: one updating line; else plain lines
//   progress.update(step, loss, tokens_per_s);
//
//   ProgressScope scope("eval");             // a command turns its engine work's progress on
//   WorkProgress p("reading 1,115,394 tokens of 'x.txt' in 8,714 windows of 128", 8714, "windows");
//   p.update(done);  ...  p.done();          // "eval: 4,000/8,714 windows (45%) | ..." then "eval: done, ..."
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tapeformer {

// A number as JSON: "%.6g"-style digits (or `digits`), and null for NaN or
// infinity, which JSON cannot hold.
std::string json_number(double v, int digits = 6);
// The same with `digits` fixed decimals ("%.*f"), null for NaN or infinity.
std::string json_fixed(double v, int digits);

// What `sample` and `eval --report-layers` say when a model's layers logged
// no figures (Module::layer_metrics) while reading.
extern const char* const kNoLayerFigures;

struct MetricsRecord {
  int64_t step = 0;
  double lr = 0;
  double train_loss = 0;
  std::optional<double> val_loss;  // on evaluation steps only, nats per token
  std::optional<double> val_bpc;   // the same in bits per character (tokenizers compare)
  double grad_norm = 0;
  double tokens_per_s = 0;  // training tokens per second of training-loop time
  double elapsed_s = 0;     // training-loop time so far (evaluation excluded)
  std::vector<std::pair<std::string, std::vector<double>>> layers;  // on evaluation steps: Module::layer_metrics
  std::vector<std::pair<std::string, double>> extra;  // on evaluation steps: a program's own figures (accuracy)
  std::string to_json() const;
  // The record in one line written by to_json(), its per-layer figures and
  // a program's own figures included; nothing for a line that is not one
  // (e.g. the half-written last line of a killed run).
  static std::optional<MetricsRecord> parse(const std::string& line);
};

// The records of a metrics.jsonl file in order, lines that are not one
// skipped; none when the file is missing.
std::vector<MetricsRecord> read_metrics(const std::string& path);

// Appends one JSON object per line; each line is flushed as it is written.
class MetricsLog {
 public:
  MetricsLog(const std::string& path, bool append);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const MetricsRecord& r);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

// One status line on stderr: on a terminal, a line rewritten in place;
// otherwise each text shown is a plain line of its own. Progress and
// WorkProgress draw on it.
class StatusLine {
 public:
  // shown = false prints nothing.
  explicit StatusLine(bool shown = true);
  ~StatusLine() { close(); }  // an error message then starts on a line of its own
  StatusLine(const StatusLine&) = delete;
  StatusLine& operator=(const StatusLine&) = delete;
  bool tty() const { return tty_; }
  // Terminal: the open line becomes `text`; otherwise `text` as a line.
  void show(const std::string& text);
  // `line` on a line of its own (an open line is cleared first).
  void note(const std::string& line);
  // Ends an open line, leaving it as it is.
  void close();

 private:
  bool tty_;
  bool shown_;
  bool open_ = false;
};

// Progress on stderr: on a terminal, one line rewritten in place (step/total,
// loss, tokens/s, ETA); otherwise a plain log line per update.
class Progress {
 public:
  // shown = false prints nothing (the ranks other than 0 of a distributed run).
  explicit Progress(int64_t total_steps, bool shown = true);
  ~Progress() { finish(); }  // an error message then starts on a line of its own
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void update(int64_t step, double loss, double tokens_per_s, double seconds_per_step);
  // A message on its own line (evaluation results, checkpoint notes).
  void note(const std::string& line);
  void finish();

 private:
  int64_t total_;
  StatusLine line_;
};

// Turns on the progress of a command's long work (each WorkProgress opened
// while it lives on this thread: Evaluator::read_text for eval, knn build
// and a model kind's tables; calibrate's readings; rl eval's episodes),
// named by the command. Without one (library calls, tests, bench programs)
// WorkProgress prints nothing. Scopes nest like NoGradGuard; the innermost
// names the lines.
//
// Quick work stays quiet, so that a script's stderr holds only an error
// line: a WorkProgress shows itself once its work has taken, or on its
// pace over its first quarter second is expected to take,
// TAPEFORMER_PROGRESS_DELAY seconds (default 2; 0 shows all work), and from
// then on every later one in the scope shows at once. A value of the
// variable that is not a number in [0, 1e9] is an Error naming it.
class ProgressScope {
 public:
  explicit ProgressScope(std::string who);
  ~ProgressScope();
  ProgressScope(const ProgressScope&) = delete;
  ProgressScope& operator=(const ProgressScope&) = delete;
  // The innermost scope open on this thread, or null.
  static ProgressScope* current();

 private:
  friend class WorkProgress;
  std::string who_;
  double delay_s_;
  bool spoken_ = false;  // a WorkProgress of this scope has shown itself
  ProgressScope* outer_;
};

// The progress of one piece of long work, on stderr within a ProgressScope
// (else nothing): a line saying what it will do and how much, then updates
// (on a terminal one line rewritten at most 10 times a second; otherwise a
// line per tenth of the work, at most one every 5 s), and done()'s closing
// line. Without done() (an error), an open line is only ended, so that the
// error starts on a line of its own. One at a time: open the next once this
// one is done.
//
//   ProgressScope scope("rl eval");   // the command, once
//   WorkProgress p("playing 2,000 episodes of \"keys_doors\" conditioned on return 0", 2000, "episodes");
//   p.update(726, "mean return -3.10");   // "rl eval: 726/2,000 episodes (36%) | 138 episodes/s | ETA 9s | mean return -3.10"
//   p.done("mean return -3.02");          // "rl eval: done, 2,000 episodes in 15.0s, mean return -3.02"
class WorkProgress {
 public:
  // start: what the work will do (after "WHO: "); total: its units (0:
  // unknown, no share or ETA shown); unit: their name, plural ("windows").
  WorkProgress(std::string start, int64_t total, std::string unit);
  ~WorkProgress() = default;  // the StatusLine ends an open line
  WorkProgress(const WorkProgress&) = delete;
  WorkProgress& operator=(const WorkProgress&) = delete;
  // done units so far; detail: a figure so far, added to the line ("mean return 0.8").
  void update(int64_t done, const std::string& detail = "");
  // The closing line: the units done, the time taken and `detail`.
  void done(const std::string& detail = "");

 private:
  using Clock = std::chrono::steady_clock;
  void start_showing();
  std::string counts() const;
  ProgressScope* scope_;
  std::string start_, unit_;
  int64_t total_, done_ = 0;
  StatusLine line_;
  bool showing_ = false;   // the start line is out
  bool updated_ = false;   // an update's line is out
  bool finished_ = false;  // done() was called: nothing more
  Clock::time_point began_, last_line_;
  int64_t last_tenth_ = 0;
};

// n with its digits grouped by thousands: 1115394 -> "1,115,394".
std::string grouped(int64_t n);

}  // namespace tapeformer
