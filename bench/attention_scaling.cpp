// E2b (SPEC §8; "Transformers are RNNs" Fig. 1): one causal attention layer,
// forward + backward, at growing sequence length N with the batch shrinking so
// that B * N stays fixed; time and peak tensor memory.
//
//   build/bench/attention_scaling --kind linear --out out/e2b/linear [--tokens 32768] [--max-n 16384]
//
// Kinds: "softmax" (the memory-lean kernel, softmax_attention), "softmax-fused"
// (the kernel that keeps the (N, N) probabilities, causal_attention), "linear"
// (elu + 1 features and linear_attention). One head of d_h = 64 (SPEC's H = 1).
// Each N: one warm-up call, then the median of --repeats timed calls of
// forward + backward with a random upstream gradient; peak memory is the most
// tensor bytes alive during one call (Storage::peak_bytes: inputs, outputs,
// saved tensors and gradients; kernels' per-thread tiles are not tensors).
// Writes OUT/metrics.jsonl, a line per N, and prints one JSON line with the
// log-log slopes of time and memory per sample against N, and the ratio of
// the largest to the smallest time per token from N = 512 on (1 = flat).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "bench/bench_common.h"
#include "core/error.h"
#include "core/parallel.h"
#include "train/metrics.h"

using namespace tapeformer;

namespace {

struct Point {
  int64_t N, B;
  double ms_per_call, peak_bytes;
};

// Least-squares slope of log(y) against log(x).
double loglog_slope(const std::vector<double>& x, const std::vector<double>& y) {
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += std::log(x[i]), my += std::log(y[i]);
  mx /= static_cast<double>(x.size());
  my /= static_cast<double>(x.size());
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double dx = std::log(x[i]) - mx;
    sxy += dx * (std::log(y[i]) - my);
    sxx += dx * dx;
  }
  return sxx > 0 ? sxy / sxx : 0;
}

Tensor random(const Shape& s, Rng& rng) {
  Tensor t = Tensor::empty(s);
  rng.fill_normal(t, 0.0f, 1.0f);
  return t;
}

// One forward + backward of the kind on (B, 1, N, D) inputs.
void step(const std::string& kind, const std::vector<Var>& in, const Tensor& upstream) {
  Var y;
  if (kind == "softmax") {
    y = softmax_attention(in[0], in[1], in[2]);  // (B, 1, N, D)
  } else if (kind == "softmax-fused") {
    y = causal_attention(in[0], 1);  // qkv (B, N, 3D) -> (B, N, D)
  } else {
    y = linear_attention(add_scalar(elu(in[0]), 1.0f), add_scalar(elu(in[1]), 1.0f), in[2]);
  }
  backward(y, upstream);
}

int run(int argc, char** argv) {
  CLI::App app{"E2b: attention forward + backward time and memory against sequence length"};
  std::string kind = "linear", out;
  int64_t tokens = 32768, min_n = 256, max_n = 16384, d = 64, repeats = 5;
  app.add_option("--kind", kind, "softmax | softmax-fused | linear")->capture_default_str();
  app.add_option("--out", out, "directory for metrics.jsonl (none: stdout only)");
  app.add_option("--tokens", tokens, "B * N, fixed")->capture_default_str();
  app.add_option("--min-n", min_n, "smallest N (a power of two)")->capture_default_str();
  app.add_option("--max-n", max_n, "largest N")->capture_default_str();
  app.add_option("--head-dim", d, "d_h")->capture_default_str();
  app.add_option("--repeats", repeats, "timed calls per N (median)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  TAPEFORMER_CHECK(kind == "softmax" || kind == "softmax-fused" || kind == "linear",
                   "attention_scaling: --kind must be softmax, softmax-fused or linear, got ", kind);
  TAPEFORMER_CHECK(min_n >= 1 && max_n >= min_n && tokens >= max_n && repeats >= 1 && d >= 1,
                   "attention_scaling: need 1 <= min-n <= max-n <= tokens, repeats >= 1, head-dim >= 1");
  bench::MetricsFile metrics(out, "attention_scaling");
  std::vector<Point> points;
  Rng rng(1);
  for (int64_t N = min_n; N <= max_n; N *= 2) {
    const int64_t B = tokens / N;
    std::vector<Var> in;
    if (kind == "softmax-fused") {
      in.emplace_back(random({B, N, 3 * d}, rng), true);
    } else {
      for (int i = 0; i < 3; ++i) in.emplace_back(random({B, 1, N, d}, rng), true);
    }
    const Tensor upstream = random(kind == "softmax-fused" ? Shape{B, N, d} : Shape{B, 1, N, d}, rng);
    const auto clear = [&] {
      for (const Var& v : in) v.zero_grad();
    };
    step(kind, in, upstream);  // warm-up: buffers, caches
    clear();
    Storage::release_cache();  // so the peak counts what one call allocates
    Storage::reset_peak();
    std::vector<double> ms;
    for (int64_t r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      step(kind, in, upstream);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      clear();
    }
    const double peak = static_cast<double>(Storage::peak_bytes());
    std::sort(ms.begin(), ms.end());
    const Point p{N, B, ms[ms.size() / 2], peak};
    points.push_back(p);
    char line[512];
    std::snprintf(line, sizeof line,
                  "{\"N\": %lld, \"B\": %lld, \"ms_per_call\": %.4f, \"ms_per_sample\": %.4f, \"us_per_token\": %.5f, "
                  "\"peak_mb\": %.3f, \"peak_mb_per_sample\": %.4f}",
                  static_cast<long long>(N), static_cast<long long>(B), p.ms_per_call, p.ms_per_call / B,
                  1e3 * p.ms_per_call / static_cast<double>(B * N), peak / 1e6, peak / 1e6 / static_cast<double>(B));
    metrics.write(line);
  }
  std::vector<double> n, per_sample, mem, per_token;
  for (const Point& p : points) {
    n.push_back(static_cast<double>(p.N));
    per_sample.push_back(p.ms_per_call / static_cast<double>(p.B));
    mem.push_back(p.peak_bytes / static_cast<double>(p.B));
    if (p.N >= 512) per_token.push_back(p.ms_per_call / static_cast<double>(p.B * p.N));
  }
  const auto at = [&](int64_t N) {
    for (const Point& p : points)
      if (p.N == N) return p.ms_per_call / static_cast<double>(p.B);
    return std::nan("");
  };
  const double flat = per_token.empty() ? std::nan("")
                                        : *std::max_element(per_token.begin(), per_token.end()) /
                                              *std::min_element(per_token.begin(), per_token.end());
  const auto number = [](double v) { return json_number(v, 4); };
  std::printf("{\"kind\": \"%s\", \"slope_time_per_sample\": %s, \"slope_memory_per_sample\": %s, "
              "\"ms_per_sample_at_8192\": %s, \"time_per_token_max_over_min\": %s, \"threads\": %d}\n",
              kind.c_str(), number(loglog_slope(n, per_sample)).c_str(), number(loglog_slope(n, mem)).c_str(),
              number(at(8192)).c_str(), number(flat).c_str(), parallel::num_threads());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("attention_scaling", run, argc, argv); }
