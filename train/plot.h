// `tapeformer plot`: the train and validation loss curves of one or more runs
// on shared axes, as a PNG drawn by gnuplot (Debian's gnuplot-nox, which
// scripts/setup.sh installs): a well-kept plotting tool rather than a
// hand-written rasteriser.
//
//   PlotArgs a;  a.runs = {"out/softmax", "out/linear"};  a.output = "curves.png";
//   run_plot(a);   // one colour per run: validation loss solid with points, train loss thin
//   a.layer = "ponder_mean";  run_plot(a);   // a per-layer figure the runs log instead
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
#pragma once

#include <string>
#include <vector>

namespace tapeformer {

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

}  // namespace tapeformer
