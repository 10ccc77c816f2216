// The statistics of `tapeformer calibrate` (train/calibrate.h): the
// Hoeffding and Bentkus p-values against values computed independently
// (Python's math.comb and math.log, printed in the comments), fixed-sequence
// testing stopping at the first failure, and the grid search.
#include <doctest/doctest.h>

#include "tapeformer/train/calibration.h"

using namespace tapeformer;
using namespace tapeformer::calibration;

TEST_CASE("calibrate: Hoeffding and Bentkus p-values of 'risk > delta' equal hand-computed values") {
  // (r, n, delta): Hoeffding exp(-n h(r, delta)), Bentkus e P(Bin(n, delta) <= ceil(n r))
  struct Case {
    double r;
    int64_t n;
    double delta, hoeffding, bentkus;
  };
  const Case cases[] = {{0.0, 100, 0.1, 2.6561398887587334e-05, 7.220136793458152e-05},
                        {0.05, 100, 0.1, 0.18812472262917915, 0.15651020427695356},
                        {0.05, 400, 0.1, 0.0012525166001179525, 0.0005676079452857906},
                        {0.08, 1000, 0.1, 0.09356395403485389, 0.04787322341187603},
                        {0.12, 100, 0.1, 1.0, 1.0}};
  for (const Case& c : cases) {
    CAPTURE(c.r);
    CAPTURE(c.n);
    CHECK(hoeffding_p(c.r, c.n, c.delta) == doctest::Approx(c.hoeffding).epsilon(1e-9));
    CHECK(bentkus_p(c.r, c.n, c.delta) == doctest::Approx(c.bentkus).epsilon(1e-9));
    CHECK(hoeffding_bentkus_p(c.r, c.n, c.delta) == doctest::Approx(std::min(c.hoeffding, c.bentkus)).epsilon(1e-9));
  }
}

TEST_CASE("calibrate: fixed-sequence testing stops at the first threshold that fails; the grid search does not") {
  // n = 1000, delta 0.1, epsilon 0.05: risks 0 and 0.05 pass, 0.2 fails, the 0.01 after it is never tested.
  const std::vector<double> risks = {0.0, 0.05, 0.2, 0.01};
  CHECK(fixed_sequence(risks, 1000, 0.1, 0.05) == 1);
  CHECK(grid_search(risks, 0.1) == 3);
  CHECK(fixed_sequence({0.3, 0.0}, 1000, 0.1, 0.05) == -1);  // the most conservative fails: no exits
  CHECK(grid_search({0.3, 0.5}, 0.1) == -1);
  // 0.08 at n = 1000 passes with Bentkus (0.048 <= 0.05) though not with Hoeffding alone (0.094).
  CHECK(fixed_sequence({0.0, 0.08}, 1000, 0.1, 0.05) == 1);
  CHECK(fixed_sequence({0.0, 0.08}, 100, 0.1, 0.05) == 0);  // too few windows to tell 0.08 from 0.1
  // The grid runs from 1 (no exits in practice) down to 0.
  CHECK(grid().front() == 1.0);
  CHECK(grid().back() == 0.0);
  for (size_t i = 1; i < grid().size(); ++i) CHECK(grid()[i] < grid()[i - 1]);
}
