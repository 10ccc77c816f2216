// E2b (docs/math.md#experiments; "Transformers are RNNs" Fig. 1): one causal attention layer,
// forward + backward, at growing sequence length N with the batch shrinking so
// that B * N stays fixed; time and peak tensor memory.
//
//   build/bench/attention_scaling --kind linear --out out/e2b/linear [--tokens 32768] [--max-n 16384]
//
// Kinds: "softmax" (the memory-lean kernel, softmax_attention), "softmax-fused"
// (the kernel that keeps the (N, N) probabilities, causal_attention), "linear"
// (elu + 1 features and linear_attention), "favor" (Performer's FAVOR+:
// round(d ln d) orthogonal random features, favor_attention), and every sparse pattern
// (layers/attention/sparse.h: window, strided, fixed, longformer, bigbird; their
// options with --option window=256) through sparse_attention (one
// softmax_attention with head groups: tiles, or strided's residue classes in place), and the
// kinds that are whole layers ("lsh", "linformer", "adaptive_span": x (B, N,
// d) -> (B, N, d) with their projections, each next to the softmax layer of
// the same size; --option lsh_chunk=64, span_max=256, linformer_k=256). One
// head of d_h = 64 (H = 1, as E2b sets it). A sparse kind also times dense "softmax" at
// each N and reports, at the largest N up to 8192, its time relative to
// dense next to its fraction of the causal pairs (what the pair count
// predicts), and its memory relative to the dense kernel that stores the
// N x N probabilities (the memory a pair count predicts for: the stored
// pairs), with their quotients (1: exactly as predicted). Against the lean
// dense kernel the memory is the same: neither keeps probabilities.
// A pair count cannot predict below the work every row costs whatever it
// sees (reading q, k, v, writing y and the three gradients, its diagonal
// tile), so the same point also reports a model with that floor: time =
// floor + pairs x (dense - floor), the floor timed as the pattern where each
// query sees only itself (window 1); memory = io + pairs x (stored-P dense -
// io), io the bytes of q, k, v, y, the upstream gradient and dq, dk, dv.
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
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "bench/bench_common.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/layers/attention/adaptive_span.h"
#include "tapeformer/layers/attention/attention.h"
#include "tapeformer/layers/attention/linear.h"
#include "tapeformer/layers/attention/sparse.h"
#include "tapeformer/layers/positional/positional.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/train/metrics.h"

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

// A sparse kind's pattern with its tiles at one N, built before timing.
struct Sparse {
  const SparsePattern* pattern = nullptr;
  std::map<int64_t, std::shared_ptr<const kernels::BlockMask>> tiles;  // by head group
  int64_t pairs = 0, tile_count = 0;                                        // over the groups, per head
};

// The kinds that are whole layers (their own projections and machinery):
// one head of d, x (B, N, d) -> (B, N, d). LSH gets Reformer's chunks of 64
// with 2N / 64 buckets unless given; Linformer is not causal, so it is timed
// as the bidirectional layer it is, beside the (causal) softmax layer: a
// bidirectional softmax would do about twice the score work. Every
// registered attention kind but softmax, linear and the sparse patterns
// (timed as ops above) is such a layer, so a new kind is timed by name.
bool layer_kind(const std::string& kind) {
  return attention_kinds().find(kind) != nullptr && kind != "softmax" && kind != "linear" &&
         sparse_pattern_kinds().find(kind) == nullptr;
}

std::shared_ptr<Attention> make_layer(const std::string& kind, int64_t N, int64_t d, const ModelConfig& options) {
  ModelConfig cfg = options;
  cfg.n_embd = d;
  cfg.n_head = 1;
  cfg.block_size = N;
  cfg.attention = kind;
  cfg.causal = kind != "linformer";
  if (kind == "lsh" && !cfg.options.count("lsh_buckets"))
    cfg.options["lsh_buckets"] = std::max<int64_t>(2, (2 * N / cfg.option_int("lsh_chunk") + 1) / 2 * 2);  // even
  Rng rng(3);
  const auto pos = positional_kinds().get(cfg.positional).make(cfg, rng);
  std::shared_ptr<Attention> layer = attention_kinds().get(kind).make(cfg, pos->make_layer(rng), rng);
  if (auto* span = dynamic_cast<AdaptiveSpanAttention*>(layer.get())) {
    Tensor rho = span->rho.value();  // every head at its longest span, model.span_max
    for (int64_t h = 0; h < rho.dim(0); ++h) rho.at({h}) = 1.0f;
  }
  return layer;
}

// One forward + backward of the kind on (B, H, N, D) inputs (a layer: x (B, N, d)).
void step(const std::string& kind, const std::vector<Var>& in, const Tensor& upstream, const Sparse* sparse,
          const Attention* layer) {
  Var y;
  if (layer) {
    static Rng rng(5);  // LSH's rotations, drawn anew each call as in training
    y = layer->forward(in[0], rng);
  } else if (sparse) {
    y = sparse_attention(*sparse->pattern, in[0], in[1], in[2], {}, 0, 0, 0, nullptr,
                         [&](int64_t g, const SparsePattern&) { return sparse->tiles.at(g); });
  } else if (kind == "softmax") {
    y = softmax_attention(in[0], in[1], in[2]);  // (B, 1, N, D)
  } else if (kind == "favor") {
    static Tensor omega;  // (D, m), drawn once
    const int64_t D = in[0].dim(3);
    if (!omega.defined()) {
      Rng rng(7);
      omega = orthogonal_random_features(D, favor_features(D, 0), rng);
    }
    const auto log_features = [&](const Var& x) {
      const Var xs = mul_scalar(x, std::pow(static_cast<float>(D), -0.25f));
      return sub(matmul(xs, Var(omega)), mul_scalar(sum(mul(xs, xs), {-1}, true), 0.5f));
    };
    y = favor_attention(log_features(in[0]), log_features(in[1]), in[2]);
  } else if (kind == "softmax-fused" || kind == "softmax-fused-2") {
    y = causal_attention(in[0], kind == "softmax-fused" ? 1 : 2);  // qkv (B, N, 3 H D) -> (B, N, H D)
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
  number_option(&app, "--tokens", tokens, "B * N, fixed")->capture_default_str();
  number_option(&app, "--min-n", min_n, "smallest N (a power of two)")->capture_default_str();
  number_option(&app, "--max-n", max_n, "largest N")->capture_default_str();
  number_option(&app, "--head-dim", d, "d_h")->capture_default_str();
  number_option(&app, "--repeats", repeats, "timed calls per N (median)")->capture_default_str();
  std::vector<std::string> options;
  app.add_option("--option", options, "a sparse pattern's option, name=value (e.g. window=256)");
  check_number_options(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const SparsePatternKind* sparse = sparse_pattern_kinds().find(kind);
  TAPEFORMER_CHECK(kind == "softmax" || kind == "softmax-fused" || kind == "linear" || kind == "favor" ||
                       sparse != nullptr || layer_kind(kind),
                   "attention_scaling: --kind must be softmax, softmax-fused, linear, favor or an attention kind (",
                   attention_kinds().names(), "), got ", kind);
  ModelConfig cfg;
  for (const std::string& o : options) {
    const size_t eq = o.find('=');
    TAPEFORMER_CHECK(eq != std::string::npos, "attention_scaling: --option ", o, " is not name=value");
    cfg.options[o.substr(0, eq)] = parse_number<int64_t>(o.substr(eq + 1), "--option " + o.substr(0, eq));
  }
  const std::shared_ptr<const SparsePattern> pattern = sparse ? sparse->make(cfg) : nullptr;
  // A pattern that splits heads into groups gets one head per group (and so does dense, beside it).
  const int64_t heads = pattern && !pattern->head_groups().empty() ? static_cast<int64_t>(pattern->head_groups().size()) : 1;
  TAPEFORMER_CHECK(min_n >= 1 && max_n >= min_n && tokens >= max_n && repeats >= 1 && d >= 1,
                   "attention_scaling: need 1 <= min-n <= max-n <= tokens, repeats >= 1, head-dim >= 1");
  bench::MetricsFile metrics(out, "attention_scaling");
  std::vector<Point> points;
  struct Versus {
    int64_t N = 0;
    double time = 0, memory = 0, memory_lean = 0, pairs = 0;  // sparse / dense (memory: / the kernel storing P)
    double time_floor_model = 0, memory_floor_model = 0;      // sparse / (floor + pairs x (dense - floor))
    double layer_time = 0, layer_memory = 0;                  // a layer kind / the softmax layer
  } versus;
  const int64_t versus_n = [&] {
    int64_t v = min_n;
    while (v * 2 <= std::min<int64_t>(max_n, 8192)) v *= 2;
    return v;
  }();
  Rng rng(1);
  for (int64_t N = min_n; N <= max_n; N *= 2) {
    const int64_t B = tokens / N;
    std::vector<Var> in;
    std::shared_ptr<Attention> layer, dense_layer;
    if (layer_kind(kind)) {
      layer = make_layer(kind, N, d, cfg);
      dense_layer = make_layer("softmax", N, d, ModelConfig{});  // the softmax kind is causal
      in.emplace_back(random({B, N, d}, rng), true);  // x (B, N, d)
    } else if (kind == "softmax-fused") {
      in.emplace_back(random({B, N, 3 * d}, rng), true);
    } else {
      for (int i = 0; i < 3; ++i) in.emplace_back(random({B, heads, N, d}, rng), true);
    }
    const Tensor upstream =
        random(kind == "softmax-fused" || layer ? Shape{B, N, d} : Shape{B, heads, N, d}, rng);
    std::unique_ptr<Sparse> tiles;
    if (pattern) {
      tiles = std::make_unique<Sparse>();
      tiles->pattern = pattern.get();
      const auto groups = pattern->head_groups();
      for (int64_t g = 0; g < heads; ++g) {
        const SparsePattern& pg = groups.empty() ? *pattern : *groups[static_cast<size_t>(g)];
        if (pg.period() > 0) {  // residue classes, causal, in place: no tiles
          for (int64_t c = 0; c < pg.period(); ++c) {
            const int64_t n = c < N ? (N - 1 - c) / pg.period() + 1 : 0;
            tiles->pairs += n * (n + 1) / 2;
          }
          continue;
        }
        const auto t = tile_pattern(pg, N, N, 0, 0);
        tiles->tiles[g] = t;
        tiles->pairs += t->pairs;
        tiles->tile_count += t->tiles();
      }
    }
    // Median time and peak bytes of one forward + backward.
    const auto measure = [&](const std::string& k, const Sparse* t, const std::vector<Var>& x, const Tensor& up,
                             const Attention* layer = nullptr) {
      const auto clear = [&] {
        for (const Var& v : x) v.zero_grad();
      };
      step(k, x, up, t, layer);  // warm-up: buffers, caches
      clear();
      Storage::release_cache();  // so the peak counts what one call allocates
      Storage::reset_peak();
      std::vector<double> ms;
      for (int64_t r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        step(k, x, up, t, layer);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        clear();
      }
      std::sort(ms.begin(), ms.end());
      return std::pair<double, double>{ms[ms.size() / 2], static_cast<double>(Storage::peak_bytes())};
    };
    const auto [ms, peak] = measure(kind, tiles.get(), in, upstream, layer.get());
    const Point p{N, B, ms, peak};
    points.push_back(p);
    char line[768];
    int len = std::snprintf(line, sizeof line,
                            "{\"N\": %lld, \"B\": %lld, \"ms_per_call\": %.4f, \"ms_per_sample\": %.4f, "
                            "\"us_per_token\": %.5f, \"peak_mb\": %.3f, \"peak_mb_per_sample\": %.4f",
                            static_cast<long long>(N), static_cast<long long>(B), p.ms_per_call, p.ms_per_call / B,
                            1e3 * p.ms_per_call / static_cast<double>(B * N), peak / 1e6,
                            peak / 1e6 / static_cast<double>(B));
    if (tiles) {
      const auto [dense_ms, dense_peak] = measure("softmax", nullptr, in, upstream);
      const double causal_pairs = static_cast<double>(N) * static_cast<double>(N + 1) / 2;
      const double pairs = static_cast<double>(tiles->pairs) / (causal_pairs * static_cast<double>(heads));
      if (N == versus_n) {
        const std::vector<Var> qkv{Var(random({B, N, 3 * d * heads}, rng), true)};
        const double stored_p_peak = measure(heads == 1 ? "softmax-fused" : "softmax-fused-2", nullptr, qkv,
                                             random({B, N, d * heads}, rng)).second;
        // The floor: each query of every head sees only itself.
        const auto self_only = sparse_pattern_kinds().get("window").make([] {
          ModelConfig c;
          c.options["window"] = int64_t{1};
          return c;
        }());
        Sparse floor;
        floor.pattern = self_only.get();
        floor.tiles[0] = tile_pattern(*self_only, N, N, 0, 0);
        const double floor_ms = measure(kind, &floor, in, upstream).first;
        const double io = 8.0 * static_cast<double>(B * heads * N * d) * sizeof(Scalar);
        versus = {N,
                  ms / dense_ms,
                  peak / stored_p_peak,
                  peak / dense_peak,
                  pairs,
                  ms / (floor_ms + pairs * (dense_ms - floor_ms)),
                  peak / (io + pairs * (stored_p_peak - io))};
      }
      len += std::snprintf(line + len, sizeof line - static_cast<size_t>(len),
                           ", \"dense_ms_per_sample\": %.4f, \"time_vs_dense\": %.4f, \"pairs_vs_dense\": %.5f, "
                           "\"tiles\": %lld",
                           dense_ms / B, ms / dense_ms, pairs, static_cast<long long>(tiles->tile_count));
    }
    if (layer) {
      const auto [dense_ms, dense_peak] = measure("softmax", nullptr, in, upstream, dense_layer.get());
      if (N == versus_n) versus.N = N, versus.layer_time = ms / dense_ms, versus.layer_memory = peak / dense_peak;
      len += std::snprintf(line + len, sizeof line - static_cast<size_t>(len),
                           ", \"dense_layer_ms_per_sample\": %.4f, \"time_vs_dense_layer\": %.4f", dense_ms / B,
                           ms / dense_ms);
    }
    std::snprintf(line + len, sizeof line - static_cast<size_t>(len), "}");
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
  std::string vs;
  if (pattern)
    vs = ", \"versus_n\": " + std::to_string(versus.N) + ", \"time_vs_dense\": " + number(versus.time) +
         ", \"memory_vs_dense\": " + number(versus.memory) + ", \"memory_vs_dense_lean\": " +
         number(versus.memory_lean) + ", \"pairs_vs_dense\": " + number(versus.pairs) +
         ", \"time_over_predicted\": " + number(versus.time / versus.pairs) +
         ", \"memory_over_predicted\": " + number(versus.memory / versus.pairs) +
         ", \"time_over_floor_model\": " + number(versus.time_floor_model) +
         ", \"memory_over_floor_model\": " + number(versus.memory_floor_model);
  if (layer_kind(kind))
    vs = ", \"versus_n\": " + std::to_string(versus.N) + ", \"time_vs_dense_layer\": " + number(versus.layer_time) +
         ", \"memory_vs_dense_layer\": " + number(versus.layer_memory);
  std::printf("{\"kind\": \"%s\", \"slope_time_per_sample\": %s, \"slope_memory_per_sample\": %s, "
              "\"ms_per_sample_at_8192\": %s, \"time_per_token_max_over_min\": %s%s, \"threads\": %d}\n",
              kind.c_str(), number(loglog_slope(n, per_sample)).c_str(), number(loglog_slope(n, mem)).c_str(),
              number(at(8192)).c_str(), number(flat).c_str(), vs.c_str(), parallel::num_threads());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("attention_scaling", run, argc, argv); }
