#include "tapeformer/train/calibration.h"

#include <algorithm>
#include <cmath>

namespace tapeformer {

namespace calibration {

const std::vector<double>& grid() {
  static const std::vector<double> lambdas = {1.0,  0.9999, 0.9995, 0.999, 0.998, 0.995, 0.99, 0.98, 0.97, 0.95, 0.93,
                                              0.9,  0.85,   0.8,    0.75,  0.7,   0.6,   0.5,  0.4,  0.3,  0.2,  0.1, 0.0};
  return lambdas;
}

double hoeffding_p(double r, int64_t n, double delta) {
  const double a = std::min(r, delta), b = delta;
  if (a >= b) return 1.0;
  const double h = (a > 0 ? a * std::log(a / b) : 0.0) + (1 - a) * std::log((1 - a) / (1 - b));
  return std::exp(-static_cast<double>(n) * h);
}

double bentkus_p(double r, int64_t n, double delta) {
  const auto k = static_cast<int64_t>(std::ceil(static_cast<double>(n) * r - 1e-9));
  if (k >= n) return 1.0;
  // P(Binomial(n, delta) <= k), summed in log space.
  double cdf = 0;
  for (int64_t i = 0; i <= k; ++i) {
    const double log_term = std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(i) + 1) -
                            std::lgamma(static_cast<double>(n - i) + 1) + static_cast<double>(i) * std::log(delta) +
                            static_cast<double>(n - i) * std::log1p(-delta);
    cdf += std::exp(log_term);
  }
  return std::min(1.0, std::exp(1.0) * cdf);
}

double hoeffding_bentkus_p(double r, int64_t n, double delta) {
  return std::min(hoeffding_p(r, n, delta), bentkus_p(r, n, delta));
}

int64_t fixed_sequence(const std::vector<double>& risks, int64_t n, double delta, double epsilon) {
  int64_t chosen = -1;
  for (size_t i = 0; i < risks.size(); ++i) {
    if (hoeffding_bentkus_p(risks[i], n, delta) > epsilon) break;
    chosen = static_cast<int64_t>(i);
  }
  return chosen;
}

int64_t grid_search(const std::vector<double>& risks, double delta) {
  int64_t chosen = -1;
  for (size_t i = 0; i < risks.size(); ++i)
    if (risks[i] <= delta) chosen = static_cast<int64_t>(i);
  return chosen;
}

}  // namespace calibration

}  // namespace tapeformer
