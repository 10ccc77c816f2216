#include "tapeformer/train/plot.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tapeformer/core/error.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/run_directory.h"

namespace tapeformer {
namespace fs = std::filesystem;

namespace {

// A string as a gnuplot single-quoted literal ('' escapes a quote).
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

bool have_gnuplot() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

// The per-layer figure `layer` of one run's metrics into `file`: step and
// value when it holds one value, else index and value at its last
// evaluation (the x label goes into `script`). Returns the plot clause
// without its style; Error when the run never logs it.
std::string layer_series(std::istream& in, const std::string& run, const std::string& layer, const fs::path& file,
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
  TAPEFORMER_CHECK(!logged.empty(), "plot: run '", run, "' logs no per-layer figure '", layer, "' (",
                   known.empty() ? std::string("it logs none") : "it logs " + known, ")");
  std::ofstream out(file);
  const bool scalar = std::all_of(logged.begin(), logged.end(), [](const auto& l) { return l.second.size() == 1; });
  if (scalar) {
    for (const auto& [step, values] : logged) out << step << ' ' << values[0] << '\n';
    script << "set xlabel 'step'\n";
    return quoted(file.string()) + " with linespoints";
  }
  const auto& [step, values] = logged.back();
  for (size_t k = 0; k < values.size(); ++k) out << k << ' ' << values[k] << '\n';
  script << "set xlabel " << quoted("entry (index from 0) at the last evaluation, step " + std::to_string(step)) << "\n";
  return quoted(file.string()) + " with linespoints";
}

// A run's rl eval lines as (target, mean, sd) sorted by target into `file`;
// Error naming the file when it holds none.
void achieved_series(const std::string& path, const fs::path& file) {
  std::ifstream in(path);
  TAPEFORMER_CHECK(in.good(), "plot --achieved: cannot read '", path, "' (a file of tapeformer rl eval --log lines)");
  std::vector<std::array<double, 3>> points;
  int64_t number = 0;
  for (std::string line; std::getline(in, line);) {
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
  std::ofstream out(file);
  for (const auto& p : points) out << p[0] << ' ' << p[1] << ' ' << p[2] << '\n';
}

}  // namespace

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
  TAPEFORMER_CHECK(have_gnuplot(), "plot: gnuplot is not installed (bash scripts/setup.sh gnuplot-nox)");
  const fs::path work = fs::temp_directory_path() / ("tapeformer-plot-" + std::to_string(::getpid()));
  fs::create_directories(work);
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{work};

  std::ostringstream script;
  script << "set terminal pngcairo size 960,600 noenhanced\n"
         << "set output " << quoted(args.output) << "\n"
         << "set grid\nset key top right\n";
  if (args.achieved) script << "set xlabel 'target return'\nset ylabel 'achieved return'\nset key top left\n";
  else if (args.layer.empty()) script << "set xlabel 'step'\nset ylabel 'loss (nats per token)'\n";
  else script << "set ylabel " << quoted(args.layer) << "\n";
  if (args.log_y) script << "set logscale y\n";
  std::string plots;
  if (args.achieved) {
    for (size_t i = 0; i < args.runs.size(); ++i) {
      const fs::path file = work / ("achieved" + std::to_string(i));
      achieved_series(inputs[i], file);
      plots += (plots.empty() ? "" : ", ") + quoted(file.string()) + " with yerrorlines lw 2 pt 7 ps 0.6 lc " +
               std::to_string(i + 1) + " title " +
               quoted(fs::is_directory(args.runs[i]) ? fs::path(inputs[i]).lexically_normal().parent_path().filename().string()
                                                     : fs::path(inputs[i]).stem().string());
    }
    plots += ", x with lines dt 2 lc rgb 'gray' title 'achieved = target'";
  }
  for (size_t i = 0; i < args.runs.size() && !args.achieved; ++i) {
    const std::string& run = args.runs[i];
    const fs::path metrics = fs::path(run) / "metrics.jsonl";
    std::ifstream in(metrics);
    TAPEFORMER_CHECK(in.good(), "plot: run '", run, "' has no metrics.jsonl (is it a run directory of tapeformer train?)");
    const std::string name = fs::path(run).filename().empty() ? fs::path(run).parent_path().filename().string()
                                                               : fs::path(run).filename().string();
    const std::string colour = " lc " + std::to_string(i + 1);
    if (!args.layer.empty()) {
      plots += (plots.empty() ? "" : ", ") + layer_series(in, run, args.layer, work / ("layer" + std::to_string(i)), script) +
               " lw 2 pt 7 ps 0.6" + colour + " title " + quoted(name);
      continue;
    }
    const fs::path train_file = work / ("train" + std::to_string(i)), val_file = work / ("val" + std::to_string(i));
    std::ofstream train_out(train_file), val_out(val_file);
    int64_t rows = 0, val_rows = 0;
    for (std::string line; std::getline(in, line);) {
      const std::optional<MetricsRecord> r = MetricsRecord::parse(line);
      if (!r) continue;
      train_out << r->step << ' ' << r->train_loss << '\n';
      ++rows;
      if (r->val_loss) val_out << r->step << ' ' << *r->val_loss << '\n', ++val_rows;
    }
    TAPEFORMER_CHECK(rows > 0, "plot: '", metrics.string(), "' holds no metrics lines");
    if (val_rows > 0)
      plots += (plots.empty() ? "" : ", ") + quoted(val_file.string()) + " with linespoints lw 2 pt 7 ps 0.6" + colour +
               " title " + quoted(name + " val");
    if (args.train)
      plots += (plots.empty() ? "" : ", ") + quoted(train_file.string()) + " with lines lw 1 dt 2" + colour +
               " title " + quoted(name + " train");
  }
  script << "plot " << plots << "\n";
  const fs::path script_file = work / "plot.gp";
  std::ofstream(script_file) << script.str();
  const std::string command = "gnuplot " + quoted(script_file.string()) + " 2> " + quoted((work / "err").string());
  if (std::system(command.c_str()) != 0) {
    std::ifstream err(work / "err");
    std::stringstream text;
    text << err.rdbuf();
    fail("plot: gnuplot could not draw '", args.output, "': ", text.str());
  }
  std::printf("plot: wrote %s (%zu run%s)\n", args.output.c_str(), args.runs.size(), args.runs.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace tapeformer
