#include "tapeformer/train/plot.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

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

}  // namespace

int run_plot(const PlotArgs& args) {
  TAPEFORMER_CHECK(!args.runs.empty(), "plot: name at least one run directory");
  TAPEFORMER_CHECK(!args.output.empty(), "plot: name the PNG to write with -o FILE.png");
  std::vector<std::string> inputs;
  for (const std::string& run : args.runs) inputs.push_back((fs::path(run) / "metrics.jsonl").string());
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
         << "set xlabel 'step'\nset ylabel 'loss (nats per token)'\nset grid\nset key top right\n";
  if (args.log_y) script << "set logscale y\n";
  std::string plots;
  for (size_t i = 0; i < args.runs.size(); ++i) {
    const std::string& run = args.runs[i];
    const fs::path metrics = fs::path(run) / "metrics.jsonl";
    std::ifstream in(metrics);
    TAPEFORMER_CHECK(in.good(), "plot: run '", run, "' has no metrics.jsonl (is it a run directory of tapeformer train?)");
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
    const std::string name = fs::path(run).filename().empty() ? fs::path(run).parent_path().filename().string()
                                                               : fs::path(run).filename().string();
    const std::string colour = " lc " + std::to_string(i + 1);
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
