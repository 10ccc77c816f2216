// `tapeformer calibrate`: the exit threshold of an early-exit model
// (layers/models/early_exit.h) chosen on held-out text, written into its run.
//
//   CalibrateArgs a;  a.run = "out/exit";  a.method = "ltt";  a.delta = 0.1;  a.epsilon = 0.05;
//   run_calibrate(a);   // prints one JSON line; OUT/checkpoint.bin gets the threshold
//
// The held-out text (the run's val split by default) is cut into windows of
// block_size tokens, shuffled by a seed and halved: calibration and test.
// For each threshold lambda of a fixed grid, from 1 (no exits in practice)
// down to 0, every window is read with exits, and its gap to the full model
// is D(lambda) in [0, 1]: the share of its positions whose most likely next
// token differs from the full model's (CALM's token-level consistency).
//
//   grid (depth-adaptive, Elbayad et al. 2020): the smallest lambda whose
//        mean gap on the calibration windows is at most delta;
//   ltt  (CALM's Learn-then-Test, Schuster et al. 2022; Angelopoulos et al.
//        2021): lambdas are tested in order from the most conservative; each
//        gets the Hoeffding-Bentkus p-value of "mean gap > delta" over the n
//        calibration windows, and the last one before the first p-value
//        above epsilon is chosen (none: exits stay off). With probability at
//        least 1 - epsilon over the calibration windows, the chosen lambda's
//        expected gap on windows from the same text is at most delta.
//   evaluate: the given --threshold only (nothing is chosen or written).
//
// The guarantee is checked by repeating the choice on `splits` random
// halvings and counting those whose test half's mean gap exceeds delta: for
// ltt that share should stay below epsilon. The run's checkpoint (under its
// run lock) gets the chosen threshold and measure; `sample` and `eval` then
// exit with them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tapeformer {

struct CalibrateArgs {
  std::string run;               // the run directory (its checkpoint.bin is rewritten)
  std::string data;              // held-out text; empty: the run's data.path
  std::string split = "val";     // all | train | val of that file (the run's data.val_fraction)
  std::string method = "ltt";    // ltt | grid | evaluate
  std::string confidence;        // max | margin | cosine; empty: the model's
  double delta = 0.1;            // tolerance on a window's gap
  double epsilon = 0.05;         // risk level (ltt)
  double threshold = 2;          // evaluate: the lambda to read with
  int64_t windows = 0;           // windows of the text to use (0: all)
  int64_t splits = 100;          // random halvings for the guarantee check
  uint64_t seed = 1;             // the halving written into the run, and the first of the checks
  std::string sweep;             // a file for one JSON line per lambda (threshold, gap, loss, layers_mean)
  bool dry_run = false;          // print, do not write the run
};

int run_calibrate(const CalibrateArgs& args);

// The pieces, for tests.
namespace calibration {
// The thresholds tried, from the most conservative (1) to 0.
const std::vector<double>& grid();
// p-values for H0 "risk > delta" given the mean r of n losses in [0, 1]:
// Hoeffding's exp(-n h(min(r, delta), delta)), h(a, b) = a ln(a/b) + (1-a) ln((1-a)/(1-b));
// Bentkus's e P(Binomial(n, delta) <= ceil(n r)); and the smaller of the two.
double hoeffding_p(double r, int64_t n, double delta);
double bentkus_p(double r, int64_t n, double delta);
double hoeffding_bentkus_p(double r, int64_t n, double delta);
// Fixed-sequence testing: the index of the last of `risks` (in testing
// order) before the first whose p-value exceeds epsilon; -1 when the first does.
int64_t fixed_sequence(const std::vector<double>& risks, int64_t n, double delta, double epsilon);
// The last index whose risk is at most delta (the grid is in decreasing
// lambda, so the smallest such lambda); -1 when none is.
int64_t grid_search(const std::vector<double>& risks, double delta);
}  // namespace calibration

}  // namespace tapeformer
