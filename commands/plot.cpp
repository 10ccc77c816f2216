// `tapeformer plot`: the train and validation loss curves of one or more runs
// on shared axes, as a PNG drawn by gnuplot (Debian's gnuplot-nox, which
// scripts/setup.sh installs): a well-kept plotting tool rather than a
// hand-written rasteriser.
//
//   tapeformer plot out/softmax out/linear -o curves.png   # one colour per run: val loss solid, train thin
//   tapeformer plot out/ut -o halting.png --layer ponder_hist   # a per-layer figure the runs log instead
//
// A per-layer figure (the "layers" of metrics lines on evaluation steps,
// Module::layer_metrics) of one value is drawn against the step; one of
// several values (a histogram, a value per head or position) as those of
// the run's last evaluation against their index.
//
// With `achieved`, each of `runs` is a file of `tapeformer rl eval --log`
// lines (or a directory holding achieved.jsonl): the achieved return's mean
// with its sd as error bars against the target return, one series per
// file, beside the line achieved = target (Chen et al. 2021, Fig. 4).
#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tapeformer/core/program_name.h"
#include "tapeformer/commands/command.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/core/subprocess.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/run_directory.h"

namespace tapeformer {
namespace {
namespace fs = std::filesystem;

struct PlotArgs {
  std::vector<std::string> runs;  // run directories (each with metrics.jsonl)
  std::string output;             // the PNG to write
  bool log_y = false;             // logarithmic loss axis
  bool train = true;              // also draw the train loss
  std::string layer;              // a per-layer figure by name ("ponder_hist") instead of the losses
  bool achieved = false;          // runs are rl eval --log files: achieved against target return
};

// gnuplot gets a fixed script on its stdin with the data inline and writes
// the PNG on its stdout, which is then written to `output` atomically: no
// path reaches the script, no temp file is made, and the only user text in
// it, the legend's names, goes through gnuplot's single-quoted strings (a
// name holding a control character is refused). Every input is opened
// without blocking and must be a regular file. Errors name the run whose
// metrics are missing or empty, and a missing gnuplot.
int run_plot(const PlotArgs& args);

// Metrics and rl eval logs are small; a larger input is not one of them.
constexpr size_t kMaxInputBytes = size_t{1} << 30;

// A name as an error message shows it: control characters as \n, \t, \xNN.
std::string shown(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    char buf[8];
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) std::snprintf(buf, sizeof buf, "\\x%02x", c), out += buf;
    else out += static_cast<char>(c);
  }
  return out;
}

// A label as a gnuplot single-quoted string. Inside one nothing is special
// but the quote itself ('' stands for it): no backquoted command, no macro,
// no backslash escape. A line break would end the command and start another,
// so a label holding any control character is refused.
std::string quoted(const std::string& s, const std::string& what) {
  for (unsigned char c : s)
    TAPEFORMER_CHECK(c >= 0x20 && c != 0x7f, "plot: ", what, " '", shown(s),
                     "' holds a control character, which a plot's labels cannot show; rename it");
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// An input as text: opened without blocking and refused unless a regular
// file (a FIFO would hold the open, a device the read); nullopt when it
// cannot be opened.
std::optional<std::istringstream> read_input(const std::string& path, const std::string& what) {
  std::optional<std::string> text = read_regular_file(path, what, kMaxInputBytes);
  if (!text) return std::nullopt;
  return std::istringstream(std::move(*text));
}

// The script's data: named blocks of "x y [z]" lines, so that the script
// holds no file name of the user's or of a temp file.
struct DataBlocks {
  std::string text;  // "$name << EOD\n...\nEOD\n" each
  int count = 0;
  // A new block holding `lines`; returns its name ("$d3").
  std::string add(const std::string& lines) {
    const std::string name = "$d" + std::to_string(count++);
    text += name + " << EOD\n" + lines + "EOD\n";
    return name;
  }
};

// The per-layer figure `layer` of one run's metrics as a data block: step
// and value when it holds one value, else index and value at its last
// evaluation (the x label goes into `script`). Returns the plot clause
// without its style; Error when the run never logs it.
std::string layer_series(std::istream& in, const std::string& run, const std::string& layer, DataBlocks& data,
                         std::ostringstream& script) {
  std::vector<std::pair<int64_t, std::vector<double>>> logged;  // (step, values)
  std::vector<std::string> names;                                // what the run logs, for the error
  for (std::string line; std::getline(in, line);) {
    const std::optional<MetricsRecord> r = MetricsRecord::parse(line);
    if (!r) continue;
    for (const auto& [key, values] : r->layers) {
      if (key == layer) logged.emplace_back(r->step, values);
      if (std::find(names.begin(), names.end(), key) == names.end()) names.push_back(key);
    }
  }
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
  TAPEFORMER_CHECK(!logged.empty(), "plot: run '", run, "' logs no per-layer figure '", shown(layer), "' (",
                   known.empty() ? std::string("it logs none") : "it logs " + known, ")");
  std::ostringstream out;
  const bool scalar = std::all_of(logged.begin(), logged.end(), [](const auto& l) { return l.second.size() == 1; });
  if (scalar) {
    for (const auto& [step, values] : logged) out << step << ' ' << values[0] << '\n';
    script << "set xlabel 'step'\n";
    return data.add(out.str()) + " with linespoints";
  }
  const auto& [step, values] = logged.back();
  for (size_t k = 0; k < values.size(); ++k) out << k << ' ' << values[k] << '\n';
  script << "set xlabel 'entry (index from 0) at the last evaluation, step " << step << "'\n";
  return data.add(out.str()) + " with linespoints";
}

// A run's rl eval lines as (target, mean, sd) sorted by target, as a data
// block; Error naming the file when it holds none.
std::string achieved_series(const std::string& path, DataBlocks& data) {
  std::optional<std::istringstream> in = read_input(path, "plot --achieved: file");
  TAPEFORMER_CHECK(in.has_value(), "plot --achieved: cannot read '", path,
                   "' (a file of ", program_name(), " rl eval --log lines)");
  std::vector<std::array<double, 3>> points;
  int64_t number = 0;
  for (std::string line; std::getline(*in, line);) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const auto field = [&](const char* name) {
      TAPEFORMER_CHECK(!j.is_discarded() && j.is_object() && j.contains(name) && j[name].is_number(), "plot --achieved: '",
                       path, "' line ", number, " is not a line of rl eval (no number \"", name, "\")");
      return j[name].get<double>();
    };
    points.push_back({field("target_return"), field("return_mean"), field("return_sd")});
  }
  TAPEFORMER_CHECK(!points.empty(), "plot --achieved: '", path, "' holds no rl eval lines");
  std::sort(points.begin(), points.end());
  std::ostringstream out;
  for (const auto& p : points) out << p[0] << ' ' << p[1] << ' ' << p[2] << '\n';
  return data.add(out.str());
}

// A run directory's name for the legend ("out/a/" is "a").
std::string run_name(const std::string& run) {
  const fs::path p(run);
  return p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
}

int run_plot(const PlotArgs& args) {
  TAPEFORMER_CHECK(!args.runs.empty(), "plot: name at least one run directory");
  TAPEFORMER_CHECK(!args.output.empty(), "plot: name the PNG to write with -o FILE.png");
  TAPEFORMER_CHECK(!args.achieved || args.layer.empty(), "plot: --achieved and --layer draw different figures; choose one");
  TAPEFORMER_CHECK(!args.achieved || (!args.log_y && args.train), "plot: --log-y and --no-train are for loss curves, "
                   "not --achieved (returns may be negative)");
  std::vector<std::string> inputs;
  for (const std::string& run : args.runs)
    inputs.push_back(!args.achieved ? (fs::path(run) / "metrics.jsonl").string()
                                    : fs::is_directory(run) ? (fs::path(run) / "achieved.jsonl").string() : run);
  RunDirectory::check_output("plot", args.output, inputs);

  // gnuplot reads the script on its stdin and writes the PNG on its stdout:
  // no path reaches the script, and no temp file is made.
  std::ostringstream script;
  DataBlocks data;
  script << "set terminal pngcairo size 960,600 noenhanced\n"
         << "set grid\nset key top right\n";
  if (args.achieved) script << "set xlabel 'target return'\nset ylabel 'achieved return'\nset key top left\n";
  else if (args.layer.empty()) script << "set xlabel 'step'\nset ylabel 'loss (nats per token)'\n";
  else script << "set ylabel " << quoted(args.layer, "--layer") << "\n";
  if (args.log_y) script << "set logscale y\n";
  std::string plots;
  if (args.achieved) {
    for (size_t i = 0; i < args.runs.size(); ++i) {
      const std::string title = fs::is_directory(args.runs[i])
                                    ? fs::path(inputs[i]).lexically_normal().parent_path().filename().string()
                                    : fs::path(inputs[i]).stem().string();
      plots += (plots.empty() ? "" : ", ") + achieved_series(inputs[i], data) +
               " with yerrorlines lw 2 pt 7 ps 0.6 lc " + std::to_string(i + 1) + " title " + quoted(title, "the file name");
    }
    plots += ", x with lines dt 2 lc rgb 'gray' title 'achieved = target'";
  }
  for (size_t i = 0; i < args.runs.size() && !args.achieved; ++i) {
    const std::string& run = args.runs[i];
    std::optional<std::istringstream> in = read_input(inputs[i], "plot: the metrics file");
    TAPEFORMER_CHECK(in.has_value(), "plot: run '", run,
                     "' has no metrics.jsonl (is it a run directory of ", program_name(), " train?)");
    const std::string name = run_name(run);
    const std::string colour = " lc " + std::to_string(i + 1);
    if (!args.layer.empty()) {
      plots += (plots.empty() ? "" : ", ") + layer_series(*in, run, args.layer, data, script) + " lw 2 pt 7 ps 0.6" +
               colour + " title " + quoted(name, "the run directory");
      continue;
    }
    std::ostringstream train_lines, val_lines;
    int64_t rows = 0, val_rows = 0;
    for (std::string line; std::getline(*in, line);) {
      const std::optional<MetricsRecord> r = MetricsRecord::parse(line);
      if (!r) continue;
      train_lines << r->step << ' ' << r->train_loss << '\n';
      ++rows;
      if (r->val_loss) val_lines << r->step << ' ' << *r->val_loss << '\n', ++val_rows;
    }
    TAPEFORMER_CHECK(rows > 0, "plot: '", inputs[i], "' holds no metrics lines");
    if (val_rows > 0)
      plots += (plots.empty() ? "" : ", ") + data.add(val_lines.str()) + " with linespoints lw 2 pt 7 ps 0.6" + colour +
               " title " + quoted(name + " val", "the run directory");
    if (args.train)
      plots += (plots.empty() ? "" : ", ") + data.add(train_lines.str()) + " with lines lw 1 dt 2" + colour +
               " title " + quoted(name + " train", "the run directory");
  }
  const ProgramResult drawn = [&] {
    try {
      return run_program({"gnuplot"}, data.text + script.str() + "plot " + plots + "\n");
    } catch (const Error& e) {
      fail("plot: ", e.what(), " (bash scripts/setup.sh gnuplot-nox)");
    }
  }();
  static const std::string kPngMagic = "\x89PNG\r\n\x1a\n";
  TAPEFORMER_CHECK(drawn.status == 0 && drawn.out.compare(0, kPngMagic.size(), kPngMagic) == 0,
                   "plot: gnuplot could not draw '", args.output, "'",
                   drawn.err.empty() ? " (exit status " + std::to_string(drawn.status) + ")" : ": " + drawn.err);
  write_file_atomic(args.output, drawn.out);
  std::printf("plot: wrote %s (%zu run%s)\n", args.output.c_str(), args.runs.size(), args.runs.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace

Command plot_command() {
  return {"plot", "train and val loss curves of runs on shared axes, as a PNG (gnuplot)",
          [](CLI::App& pl) -> CommandRunner {
            auto args = std::make_shared<PlotArgs>();
            pl.add_option("runs", args->runs,
                          "run directories (each with metrics.jsonl); with --achieved, rl eval --log files")
                ->required();
            pl.add_option("-o,--output", args->output, "the PNG to write")->required();
            pl.add_flag("--log-y", args->log_y, "logarithmic loss axis");
            pl.add_flag("!--no-train", args->train, "validation curves only");
            pl.add_option("--layer", args->layer,
                           "draw a per-layer figure the runs log instead of the losses (ponder_mean against the step; "
                           "ponder_hist, a list, at the last evaluation)");
            pl.add_flag("--achieved", args->achieved,
                         "draw the achieved return (mean and sd) against the target return of rl eval --log files");
            return [args](const CommandContext&) { return run_plot(*args); };
          }};
}

}  // namespace tapeformer
