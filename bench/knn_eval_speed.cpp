// kNN-LM evaluation time against the plain evaluation of the same model
// (train/knn.h), with each index kind.
//
//   build/bench/knn_eval_speed --checkpoint out/ts --data ../shared/data/tinyshakespeare.txt
//       --stores /tmp/knn [--kinds exact,ivf,hnsw] [--k 16] [--rounds 3] [--out out/knn_speed]     (one line)
//
// Builds a store of the checkpoint's train split per kind (timed; kept in
// --stores as PREFIX KIND.knn, an ivf one with its --nlist in the name
// (ivf4096.knn), and reused when already there, their build time then not
// measured), evaluates the val split plainly and with each store (k
// neighbours, lambda 0.25; an ivf store scanning --nprobe cells, an hnsw
// one keeping --ef-search candidates, whatever it was built with), and
// prints one JSON line: seconds and val bpc of each, and the ratio of each
// kNN-LM eval's time to the plain eval's. Each kNN-LM eval runs --rounds
// times, its time the fastest; the plain eval runs --rounds times first and
// once last, its time the fastest of those. With one kind the line also
// has knn_s, knn_ratio, knn_bpc and knn_build_s (the same figures, named
// alike for every kind).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/train/eval_file.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/knn.h"

using namespace tapeformer;

namespace {

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"kNN-LM eval time against the plain eval, per index kind"};
  std::string checkpoint, data, stores, out, kinds_text = "exact,ivf,hnsw";
  std::string prefix;
  int64_t k = 16, nlist = 0, nprobe = 8, hnsw_m = 32, ef_search = 64, rounds = 1;
  double lambda = 0.25;
  int threads = 0;
  app.add_option("--checkpoint", checkpoint, "run directory")->required();
  app.add_option("--data", data, "text file: stores from its train split, eval on its val split")->required();
  app.add_option("--stores", stores, "directory for the stores (kept, reused)")->required();
  app.add_option("--prefix", prefix, "the stores' file names start with it")->capture_default_str();
  app.add_option("--kinds", kinds_text, "comma-separated index kinds")->capture_default_str();
  number_option(&app, "--rounds", rounds, "timed evals per kind (the fastest counts)")->capture_default_str();
  number_option(&app, "--k", k, "neighbours")->capture_default_str();
  number_option(&app, "--lambda", lambda, "kNN weight")->capture_default_str();
  number_option(&app, "--nlist", nlist, "ivf cells (0: auto)")->capture_default_str();
  number_option(&app, "--nprobe", nprobe, "ivf cells per query")->capture_default_str();
  number_option(&app, "--hnsw-m", hnsw_m, "hnsw links per node")->capture_default_str();
  number_option(&app, "--ef-search", ef_search, "hnsw candidates")->capture_default_str();
  number_option(&app, "--threads", threads, "worker threads (0: all)")->capture_default_str();
  app.add_option("--out", out, "directory for metrics.jsonl (none: stdout only)");
  check_number_options(app);
  CLI11_PARSE(app, argc, argv);
  parallel::set_num_threads(threads);
  std::filesystem::create_directories(stores);
  bench::MetricsFile metrics(out, "knn_eval_speed");

  EvalArgs plain;
  plain.checkpoint = checkpoint;
  plain.data = data;
  plain.split = "val";
  TAPEFORMER_CHECK(rounds >= 1, "knn_eval_speed: --rounds must be >= 1, got ", rounds);
  EvalResult base;
  double plain_s = seconds([&] { base = evaluate_file(plain); });
  for (int64_t i = 1; i < rounds; ++i) plain_s = std::min(plain_s, seconds([&] { evaluate_file(plain); }));
  std::ostringstream line;
  line << "{\"plain_s\": " << plain_s << ", \"plain_bpc\": " << base.bpc() << ", \"tokens\": " << base.tokens
       << ", \"threads\": " << parallel::num_threads() << ", \"k\": " << k << ", \"rounds\": " << rounds;
  std::vector<std::pair<std::string, double>> times;
  const std::vector<std::string> kinds = split_names(kinds_text);
  std::ostringstream single;  // with one kind: its figures under kind-free names
  for (const std::string& kind : kinds) {
    KnnBuildArgs b;
    b.checkpoint = checkpoint;
    b.data = data;
    b.split = "train";
    b.out = stores + "/" + prefix + kind + (kind == "ivf" && nlist > 0 ? std::to_string(nlist) : "") + ".knn";
    b.index.kind = kind;
    b.index.nlist = nlist;
    b.index.nprobe = nprobe;
    b.index.hnsw_m = hnsw_m;
    b.index.ef_search = ef_search;
    double build_s = -1;
    if (!std::filesystem::exists(b.out)) build_s = seconds([&] { build_knn_store(b); });
    EvalArgs e = plain;
    e.knn.store = b.out;
    e.knn.k = k;
    e.knn.lambda = lambda;
    if (kind == "ivf") e.knn.nprobe = nprobe;  // a reused store may have been built with another
    if (kind == "hnsw") e.knn.ef_search = ef_search;
    EvalResult r;
    double s = seconds([&] { r = evaluate_file(e); });
    for (int64_t i = 1; i < rounds; ++i) s = std::min(s, seconds([&] { evaluate_file(e); }));
    times.emplace_back(kind, s);
    std::ostringstream point;
    point << "{\"kind\": \"" << kind << "\", \"build_s\": " << build_s << ", \"eval_s\": " << s
          << ", \"bpc\": " << r.bpc() << ", \"lm_bpc\": " << r.lm_loss / std::log(2.0) * r.tokens_per_char
          << ", \"keys\": " << r.knn_keys << "}";
    metrics.write(point.str().c_str());
    line << ", \"" << kind << "_build_s\": " << build_s << ", \"" << kind << "_s\": " << s << ", \"" << kind
         << "_bpc\": " << r.bpc();
    single << ", \"knn_build_s\": " << build_s << ", \"knn_s\": " << s << ", \"knn_bpc\": " << r.bpc();
  }
  plain_s = std::min(plain_s, seconds([&] { evaluate_file(plain); }));
  line << ", \"plain_best_s\": " << plain_s;
  for (const auto& [kind, s] : times) line << ", \"" << kind << "_ratio\": " << s / plain_s;
  if (kinds.size() == 1) line << single.str() << ", \"knn_ratio\": " << times[0].second / plain_s;
  line << "}";
  std::printf("%s\n", line.str().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("knn_eval_speed", run, argc, argv); }
