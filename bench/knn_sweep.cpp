// kNN-LM's val bits per character over a grid of lambda x k from one
// reading of the text and one search (train/knn.h), for the kNN-LM sweeps.
//
//   build/bench/knn_sweep --checkpoint RUN --data FILE --store S.knn [--store-data FILE]
//       [--lambdas 0,0.05,0.1,0.25,0.4,0.6] [--ks 1,4,16,64] [--index ivf --nlist 4096 --nprobe 1]
//       [--split val] [--in-vocabulary-only] [--out DIR]                                 (one line)
//
// The store is built from --store-data's (default --data) train split when
// the file is missing, and kept: never rebuilt when present (a store of
// another model is refused, as eval refuses it). The text's --split is read
// as `eval --knn` reads it (windows of the block size carrying the memory,
// searched in blocks of KnnEval::kBlock positions), once, searching each
// position's max(ks) nearest keys; the k nearest are the first k of those
// (a search returns them nearest first: checked here), so every grid point
// is knn_log_prob over a prefix, and each equals `tapeformer eval --knn S
// --knn-k K --knn-lambda L` with the same threads (tests/cli/knn_sweep.sh).
//
// --in-vocabulary-only reads a text written in characters the model's
// tokenizer lacks (which eval refuses): a copy of --data (and of
// --store-data) keeping only the characters the tokenizer encodes (and
// well-formed UTF-8) goes to OUT/, read instead; the fraction of characters
// dropped is reported.
//
// Prints one JSON line: lm_bpc (the model alone), bpc_kK_lambdaL for every
// grid point (L with p for the point: lambda0p25), the best point, hit_kK
// (the fraction of positions whose next token is among the values of their
// k nearest keys), lm_top1 and knn_top1_kK (the most likely token is the
// next one), seconds. OUT/metrics.jsonl has a line per lambda
// ({"lambda", "bpc_kK"...}) and per k ({"k", "bpc_lambdaL"..., "hit"}).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/data/corpus.h"
#include "tapeformer/data/utf8.h"
#include "tapeformer/train/eval_file.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/evaluator.h"
#include "tapeformer/train/knn.h"
#include "tapeformer/train/metrics.h"

using namespace tapeformer;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "0,0.25" -> {0, 0.25}; Error naming `what` (the flag) for an item that is no finite number.
std::vector<double> parse_doubles(const std::string& text, const std::string& what) {
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(parse_number<double>(item, what));
  return out;
}

// "0.25" -> "0p25": a lambda inside a JSON key the harness reads (its dots nest).
std::string key_of(double lambda) {
  std::string s = json_number(lambda);
  std::replace(s.begin(), s.end(), '.', 'p');
  return s;
}

struct Filtered {
  std::string path;
  int64_t characters = 0, dropped = 0;
};

// path's text with only the characters `tokenizer` encodes (and well-formed
// UTF-8), written to dir/NAME.in_vocabulary.txt.
Filtered keep_in_vocabulary(const std::string& path, const Tokenizer& tokenizer, const std::string& dir) {
  const std::string text = read_corpus_file(path, "byte");  // raw bytes: the filter decides
  std::map<uint32_t, bool> known;  // code point -> encodable, asked once each
  std::string kept;
  kept.reserve(text.size());
  Filtered f;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_decode_one(text, i, &cp);
    ++f.characters;
    if (n == 0) {  // an ill-formed byte: dropped
      ++f.dropped, ++i;
      continue;
    }
    auto it = known.find(cp);
    if (it == known.end()) {
      bool ok = true;
      try {
        tokenizer.encode(text.substr(i, n));
      } catch (const Error&) {
        ok = false;
      }
      it = known.emplace(cp, ok).first;
    }
    if (it->second)
      kept.append(text, i, n);
    else
      ++f.dropped;
    i += n;
  }
  std::filesystem::create_directories(dir);
  f.path = dir + "/" + std::filesystem::path(path).filename().string() + ".in_vocabulary.txt";
  std::ofstream out(f.path, std::ios::binary);
  out << kept;
  TAPEFORMER_CHECK(out.good(), "knn_sweep: cannot write '", f.path, "'");
  return f;
}

int run(int argc, char** argv) {
  CLI::App app{"kNN-LM bits per character over a grid of lambda x k from one search"};
  std::string checkpoint, data, store_path, store_data, split = "val", out, lambdas_text = "0,0.05,0.1,0.25,0.4,0.6",
                                                                            ks_text = "1,4,16,64";
  IndexOptions index;
  index.kind = "ivf";
  index.nlist = 4096;
  index.nprobe = 1;
  double temperature = 1.0;
  int threads = 0;
  bool in_vocabulary_only = false;
  app.add_option("--checkpoint", checkpoint, "run directory")->required();
  app.add_option("--data", data, "text file evaluated (its --split)")->required();
  app.add_option("--split", split, "all | train | val")->capture_default_str();
  app.add_option("--store", store_path, "the store (built when missing, then kept)")->required();
  app.add_option("--store-data", store_data, "text whose train split a missing store is built from (default --data)");
  app.add_option("--index", index.kind, "a missing store's index kind")->capture_default_str();
  number_option(&app, "--nlist", index.nlist, "ivf cells of a missing store")->capture_default_str();
  number_option(&app, "--nprobe", index.nprobe, "ivf cells scanned per query")->capture_default_str();
  app.add_option("--lambdas", lambdas_text, "kNN weights, comma-separated")->capture_default_str();
  app.add_option("--ks", ks_text, "neighbour counts, comma-separated")->capture_default_str();
  number_option(&app, "--temperature", temperature, "distances are divided by it")->capture_default_str();
  number_option(&app, "--threads", threads, "worker threads (0: all)")->capture_default_str();
  app.add_flag("--in-vocabulary-only", in_vocabulary_only,
               "read copies of the texts without the characters the tokenizer lacks (written to --out)");
  app.add_option("--out", out, "directory for metrics.jsonl (and the filtered copies)");
  check_number_options(app);
  CLI11_PARSE(app, argc, argv);
  parallel::set_num_threads(threads);
  const auto started = std::chrono::steady_clock::now();
  const std::vector<double> lambdas = parse_doubles(lambdas_text, "--lambdas");
  const std::vector<int64_t> ks = bench::parse_list(ks_text, "--ks");
  TAPEFORMER_CHECK(!lambdas.empty() && !ks.empty(), "knn_sweep: --lambdas and --ks must not be empty");
  for (double l : lambdas) TAPEFORMER_CHECK(l >= 0 && l < 1, "knn_sweep: every lambda must be in [0, 1), got ", l);
  for (int64_t k : ks) TAPEFORMER_CHECK(k >= 1, "knn_sweep: every k must be >= 1, got ", k);
  TAPEFORMER_CHECK(!in_vocabulary_only || !out.empty(), "knn_sweep: --in-vocabulary-only needs --out");
  const int64_t k_max = *std::max_element(ks.begin(), ks.end());
  if (store_data.empty()) store_data = data;

  Loaded l = load_model(checkpoint);
  std::ostringstream line;
  line << "{\"threads\": " << parallel::num_threads();
  if (in_vocabulary_only) {
    const Filtered f = keep_in_vocabulary(data, *l.tokenizer, out);
    line << ", \"characters\": " << f.characters << ", \"dropped\": " << f.dropped
         << ", \"dropped_fraction\": " << json_number(static_cast<double>(f.dropped) / static_cast<double>(f.characters));
    store_data = store_data == data ? f.path : store_data;
    data = f.path;
  }
  double build_s = -1;  // -1: the store was there
  if (!std::filesystem::exists(store_path)) {
    KnnBuildArgs b;
    b.checkpoint = checkpoint;
    b.data = store_data;
    if (in_vocabulary_only && store_data != data) b.data = keep_in_vocabulary(store_data, *l.tokenizer, out).path;
    b.split = "train";
    b.out = store_path;
    b.index = index;
    const auto t0 = std::chrono::steady_clock::now();
    std::filesystem::create_directories(std::filesystem::path(store_path).parent_path());
    build_knn_store(b);
    build_s = seconds_since(t0);
  }

  KnnOptions opt;
  opt.store = store_path;
  opt.k = k_max;
  opt.temperature = temperature;
  const Datastore store = [&] {
    Datastore s = open_knn_store(opt, l.cfg, *l.model, *l.tokenizer);
    if (s.index().options().kind == "ivf") s.index().set_search_options(index.nprobe, s.index().options().ef_search);
    return s;
  }();

  // The text read as evaluate_file reads it with a store (train/commands.cpp):
  // features and logits per window, the memory carried, log p_LM in double.
  const auto eval_t0 = std::chrono::steady_clock::now();
  const EvalText text = read_eval_text(data, *l.tokenizer, split, l.cfg.data.val_fraction);
  const int64_t T = l.cfg.model.block_size, C = l.cfg.model.n_embd;
  NoGradGuard no_grad;
  std::vector<float> queries, distances;  // pending (n, C); all (N, k_max)
  std::vector<int32_t> values, targets;   // all (N, k_max); (N)
  std::vector<double> log_p_lm;           // (N)
  int64_t lm_top1 = 0, searched = 0;
  const auto search_pending = [&] {
    const auto n = static_cast<int64_t>(queries.size()) / C;
    if (n == 0) return;
    const Neighbours nb = store.index().search(queries.data(), n, k_max);  // (n, k_max), nearest first
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 1; j < k_max; ++j)
        TAPEFORMER_CHECK(nb.distances[t * k_max + j - 1] <= nb.distances[t * k_max + j],
                         "knn_sweep: the search's neighbours are not nearest first (position ", searched + t,
                         "): the k nearest would not be a prefix");
    const std::vector<int32_t> v = neighbour_values(nb, store);
    distances.insert(distances.end(), nb.distances.begin(), nb.distances.end());
    values.insert(values.end(), v.begin(), v.end());
    searched += n;
    queries.clear();
  };
  HookSite site;
  site.cfg = &l.cfg;
  site.tokenizer = l.tokenizer.get();
  const std::unique_ptr<ModelHooks> hooks = make_model_hooks(site);  // the model kind's extra inputs
  Evaluator(*l.model, {hooks.get()}).read_text(text, T, l.cfg.eval.mem_len, /*features=*/true,
                                               [&](const Window& w, const Var& f) {  // f (1, W, C)
    const Tensor fc = f.value().contiguous(), lc = l.model->logits_from_features(f).value().contiguous();
    const int64_t V = lc.dim(2);
    queries.insert(queries.end(), fc.data() + w.again * C, fc.data() + (w.again + w.len) * C);
    for (int64_t t = 0; t < w.len; ++t) {  // as KnnEval::add
      const Scalar* row = lc.data() + (w.again + t) * V;  // (V)
      const int32_t y = w.targets.data[static_cast<size_t>(w.again + t)];
      log_p_lm.push_back(lm_log_prob(row, V, y));
      targets.push_back(y);
      lm_top1 += std::max_element(row, row + V) - row == y;
    }
    // The same blocks as KnnEval: an ivf search's distances depend on which
    // queries share a block, so equal blocks give eval's neighbours exactly.
    if (static_cast<int64_t>(queries.size()) / C >= KnnEval::kBlock) search_pending();
  });
  search_pending();
  const auto N = static_cast<int64_t>(targets.size());
  const double per_char = static_cast<double>(text.ids.size()) / static_cast<double>(text.characters);
  const double to_bpc = per_char / std::log(2.0);

  bench::MetricsFile metrics(out, "knn_sweep");
  double lm_loss = 0;
  for (double lp : log_p_lm) lm_loss -= lp;
  lm_loss /= static_cast<double>(N);
  line << ", \"tokens\": " << N << ", \"keys\": " << store.size() << ", \"k_max\": " << k_max
       << ", \"index\": \"" << store.index().options().describe() << "\", \"lm_loss\": " << json_number(lm_loss, 9)
       << ", \"lm_bpc\": " << json_number(lm_loss * to_bpc, 9) << ", \"lm_top1\": "
       << json_number(static_cast<double>(lm_top1) / static_cast<double>(N));
  // grid[k][lambda]: the mean loss over the positions.
  std::vector<std::vector<double>> grid(ks.size(), std::vector<double>(lambdas.size(), 0.0));
  double best = std::numeric_limits<double>::infinity();
  size_t best_k = 0, best_l = 0;
  for (size_t a = 0; a < ks.size(); ++a) {
    const int64_t k = ks[a];
    int64_t hits = 0, knn_top1 = 0;
    std::vector<double> p(static_cast<size_t>(l.tokenizer->vocab_size()));
    for (int64_t t = 0; t < N; ++t) {
      const float* d = distances.data() + t * k_max;
      const int32_t* v = values.data() + t * k_max;
      const int32_t y = targets[static_cast<size_t>(t)];
      for (size_t b = 0; b < lambdas.size(); ++b)
        grid[a][b] -= knn_log_prob(log_p_lm[static_cast<size_t>(t)], y, d, v, k, lambdas[b], temperature);
      hits += std::find(v, v + k, y) != v + k;
      // p_kNN's most likely token (ties: the nearer neighbour's).
      std::fill(p.begin(), p.end(), 0.0);
      int32_t arg = -1;
      for (int64_t i = 0; i < k; ++i) {
        if (v[i] < 0) continue;
        p[static_cast<size_t>(v[i])] += std::exp(-(static_cast<double>(d[i]) - d[0]) / temperature);
        if (arg < 0 || p[static_cast<size_t>(v[i])] > p[static_cast<size_t>(arg)]) arg = v[i];
      }
      knn_top1 += arg == y;
    }
    std::ostringstream point;
    point << "{\"k\": " << k << ", \"hit\": " << json_number(static_cast<double>(hits) / static_cast<double>(N));
    for (size_t b = 0; b < lambdas.size(); ++b) {
      const double loss = grid[a][b] / static_cast<double>(N);
      grid[a][b] = loss;
      if (loss < best) best = loss, best_k = a, best_l = b;
      point << ", \"bpc_lambda" << key_of(lambdas[b]) << "\": " << json_number(loss * to_bpc, 9);
      line << ", \"bpc_k" << k << "_lambda" << key_of(lambdas[b]) << "\": " << json_number(loss * to_bpc, 9);
    }
    point << "}";
    metrics.write(point.str().c_str());
    line << ", \"hit_k" << k << "\": " << json_number(static_cast<double>(hits) / static_cast<double>(N))
         << ", \"knn_top1_k" << k << "\": " << json_number(static_cast<double>(knn_top1) / static_cast<double>(N));
  }
  for (size_t b = 0; b < lambdas.size(); ++b) {
    std::ostringstream point;
    point << "{\"lambda\": " << json_number(lambdas[b]);
    for (size_t a = 0; a < ks.size(); ++a) point << ", \"bpc_k" << ks[a] << "\": " << json_number(grid[a][b] * to_bpc, 9);
    point << "}";
    metrics.write(point.str().c_str());
  }
  line << ", \"best_bpc\": " << json_number(best * to_bpc, 9) << ", \"best_k\": " << ks[best_k]
       << ", \"best_lambda\": " << json_number(lambdas[best_l])
       << ", \"best_gain_bpc\": " << json_number((lm_loss - best) * to_bpc, 9) << ", \"build_s\": " << json_number(build_s)
       << ", \"eval_s\": " << json_number(seconds_since(eval_t0)) << ", \"seconds\": " << json_number(seconds_since(started))
       << "}";
  std::printf("%s\n", line.str().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("knn_sweep", run, argc, argv); }
