#include <doctest/doctest.h>

#include <cereal/archives/binary.hpp>
#include <cereal/types/array.hpp>
#include <algorithm>
#include <cmath>
#include <mutex>
#include <sstream>

#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/rng.h"
#include "sampling_stats.h"

using namespace tapeformer;

TEST_CASE("Rng: same seed, same stream; different seeds differ") {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.next_u64();
    CHECK(x == b.next_u64());
    (void)c.next_u64();
  }
  CHECK(Rng(1).next_u64() != Rng(2).next_u64());
}

TEST_CASE("Rng: normal and uniform moments; bernoulli rate") {
  Rng rng(7);
  Tensor n = Tensor::empty({20000});
  rng.fill_normal(n, 1.0f, 2.0f);
  double s = 0, s2 = 0;
  for (Scalar v : n.to_vector()) s += v, s2 += double(v) * v;
  const double mean = s / n.numel(), var = s2 / n.numel() - mean * mean;
  CHECK(mean_z(mean, 1.0, 2.0, n.numel()) < kZ);
  CHECK(stdev_z(std::sqrt(var), 2.0, n.numel()) < kZ);
  Tensor u = Tensor::empty({20000});
  rng.fill_uniform(u, -1.0f, 3.0f);
  for (Scalar v : u.to_vector()) REQUIRE((v >= -1.0f && v < 3.0f));
  Tensor b = Tensor::empty({20000});
  rng.fill_bernoulli(b, 0.3f);
  double ones = 0;
  for (Scalar v : b.to_vector()) ones += v;
  CHECK(binomial_z(ones / b.numel(), 0.3, b.numel()) < kZ);
}

TEST_CASE("Rng: state round-trips through cereal and resumes the same stream") {
  Rng rng(99);
  (void)rng.normal();  // leaves a cached spare normal in the state
  std::stringstream buf;
  {
    cereal::BinaryOutputArchive out(buf);
    out(rng);
  }
  Rng restored(0);
  {
    cereal::BinaryInputArchive in(buf);
    in(restored);
  }
  CHECK(restored == rng);
  for (int i = 0; i < 10; ++i) CHECK(restored.normal() == rng.normal());
}

TEST_CASE("parallel_for covers the range exactly once, for any thread count") {
  for (int threads : {1, 2, 3}) {
    parallel::set_num_threads(threads);
    CHECK(parallel::num_threads() == threads);
    std::vector<int> hits(1001, 0);
    parallel::parallel_for(1001, 7, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i] += 1;
    });
    CHECK(std::count(hits.begin(), hits.end(), 1) == 1001);
  }
  parallel::set_num_threads(0);
  CHECK(parallel::num_threads() >= 1);
}

TEST_CASE("for_each_block visits every element of every buffer once, in fixed blocks") {
  const std::vector<int64_t> sizes{0, 1, 5, 4096, 4097, 10000};
  for (int threads : {1, 2, 3}) {
    parallel::set_num_threads(threads);
    std::vector<std::vector<int>> hits;
    for (int64_t n : sizes) hits.emplace_back(static_cast<size_t>(n), 0);
    std::vector<std::vector<int64_t>> starts(sizes.size());
    std::mutex mu;
    parallel::for_each_block(sizes, 4096, [&](size_t i, int64_t b, int64_t e) {
      std::lock_guard<std::mutex> lock(mu);
      CHECK(b % 4096 == 0);
      CHECK(e == std::min(sizes[i], b + 4096));
      starts[i].push_back(b);
      for (int64_t k = b; k < e; ++k) ++hits[i][static_cast<size_t>(k)];
    });
    for (size_t i = 0; i < sizes.size(); ++i) {
      CHECK(static_cast<int64_t>(starts[i].size()) == (sizes[i] + 4095) / 4096);
      for (int h : hits[i]) CHECK(h == 1);
    }
  }
  parallel::set_num_threads(0);
  CHECK_THROWS_WITH_AS(parallel::for_each_block({3}, 0, [](size_t, int64_t, int64_t) {}),
                       "for_each_block: block must be >= 1, got 0", Error);
}
