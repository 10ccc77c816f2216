// Tolerances for tests of random draws, in standard errors rather than a
// fixed epsilon: a fixed epsilon is either loose enough to pass a wrong
// distribution (doctest's Approx also adds epsilon * 1 of absolute slack) or
// tight enough to fail on an unlucky seed. Every test here uses a fixed seed,
// so a result never flips between runs; the bound of 5 standard errors only
// has to be honest about how far a correct sampler can land.
//
//   CHECK(binomial_z(count / double(n), p, n) < kZ);    // a frequency
//   CHECK(mean_z(mean, mu, sigma, n) < kZ);             // a sample mean
#pragma once

#include <cmath>

namespace tapeformer {

inline constexpr double kZ = 5.0;

// How many standard errors an observed frequency of n draws is from p.
inline double binomial_z(double observed, double p, double n) {
  if (p <= 0.0 || p >= 1.0) return observed == p ? 0.0 : INFINITY;  // no spread: exact or wrong
  return std::abs(observed - p) / std::sqrt(p * (1.0 - p) / n);
}

// How many standard errors a sample mean of n draws is from mu.
inline double mean_z(double mean, double mu, double sigma, double n) {
  return std::abs(mean - mu) / (sigma / std::sqrt(n));
}

// How many standard errors a sample standard deviation of n normal draws is
// from sigma (its standard error is about sigma / sqrt(2 n)).
inline double stdev_z(double sd, double sigma, double n) {
  return std::abs(sd - sigma) / (sigma / std::sqrt(2.0 * n));
}

}  // namespace tapeformer
