// The statistics of calibrating an early-exit model's threshold
// (`tapeformer calibrate`, commands/calibrate.cpp): CALM's Learn-then-Test
// (Schuster et al. 2022; Angelopoulos et al. 2021) and a grid search.
//
//   const std::vector<double>& lambdas = calibration::grid();   // 1 (no exits) down to 0
//   int64_t i = calibration::fixed_sequence(gaps, n, delta, epsilon);   // the chosen lambda's index, or -1
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tapeformer {

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
