// Metrics as JSON lines, and the one-line live progress display.
//
//   MetricsLog log(out_dir + "/metrics.jsonl", /*append=*/resuming);
//   log.write({.step = 10, .lr = 1e-3, ...});
//   Progress progress(total_steps);          // tty: one updating line; else plain lines
//   progress.update(step, loss, tokens_per_s);
#pragma once

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
  bool tty_;
  bool shown_;
  bool line_open_ = false;
};

}  // namespace tapeformer
