// kNN-LM: the mixture against hand computations, lambda = 0 equal to the
// model bit for bit (eval and sample), eval --knn against a brute-force
// recomputation on a tiny store, and stores of another model, other weights,
// another vocabulary or too few keys refused.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include "expect_error.h"
#include "fresh_checkpoint.h"
#include "tapeformer/train/checkpoint.h"
#include "tapeformer/train/eval_file.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/train/knn.h"
#include "temp_dir.h"

using namespace tapeformer;

namespace {

const std::string kText =
    "the cat sat on the mat. the dog sat on the log. a cat and a dog met on a mat by a log.\n"
    "the mat was flat and the log was long; the cat ran and the dog sat.\n";

// A checkpoint of a freshly initialised model (seed) over `text`'s
// characters: what load_model reads, without training.
std::string make_checkpoint(const TempDir& dir, const std::string& name, uint64_t seed,
                            const std::string& text = kText, int64_t mem_len = 0) {
  CharTokenizer tok(text);
  TrainConfig cfg;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 2;
  cfg.model.n_embd = 12;
  cfg.model.block_size = 16;
  cfg.model.vocab_size = tok.vocab_size();
  if (mem_len > 0) {
    cfg.model.positional = "txl";
    cfg.model.options["mem_len"] = mem_len;
  }
  return save_fresh_checkpoint(dir, name, cfg, tok, seed);
}

std::string write_text(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = (dir.path / name).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string build_store(const std::string& checkpoint, const std::string& data, const std::string& out,
                        const std::string& kind = "exact") {
  KnnBuildArgs b;
  b.checkpoint = checkpoint;
  b.data = data;
  b.out = out;
  b.index.kind = kind;
  b.index.nlist = 2;
  b.index.nprobe = 2;
  build_knn_store(b);
  return out;
}

}  // namespace

TEST_CASE("knn_log_prob: the mixture of a hand computation; lambda 0 is log p_LM exactly; stable far away") {
  const float d[4] = {1, 2, 4, 9};
  const int32_t v[4] = {3, 1, 3, -1};  // the last: no neighbour found
  const double tau = 2, lambda = 0.3, p_lm = 0.2;
  // p_kNN(3) = (e^-0.5 + e^-2) / (e^-0.5 + e^-1 + e^-2): the missing one takes no part.
  const double z = std::exp(-0.5) + std::exp(-1.0) + std::exp(-2.0);
  const double p3 = lambda * (std::exp(-0.5) + std::exp(-2.0)) / z + (1 - lambda) * p_lm;
  CHECK(knn_log_prob(std::log(p_lm), 3, d, v, 4, lambda, tau) == doctest::Approx(std::log(p3)).epsilon(1e-12));
  const double p1 = lambda * std::exp(-1.0) / z + (1 - lambda) * p_lm;
  CHECK(knn_log_prob(std::log(p_lm), 1, d, v, 4, lambda, tau) == doctest::Approx(std::log(p1)).epsilon(1e-12));
  // A token no neighbour has: only the model's share.
  CHECK(knn_log_prob(std::log(p_lm), 5, d, v, 4, lambda, tau) ==
        doctest::Approx(std::log((1 - lambda) * p_lm)).epsilon(1e-12));
  // lambda = 0: the model's log-probability, bit for bit; lambda = 1: p_kNN alone.
  for (double lp : {std::log(p_lm), -1e-9, -37.25, std::log(0.7)}) CHECK(knn_log_prob(lp, 3, d, v, 4, 0, tau) == lp);
  CHECK(knn_log_prob(std::log(p_lm), 3, d, v, 4, 1, tau) ==
        doctest::Approx(std::log((std::exp(-0.5) + std::exp(-2.0)) / z)).epsilon(1e-12));
  CHECK(knn_log_prob(std::log(p_lm), 5, d, v, 4, 1, tau) == -std::numeric_limits<double>::infinity());
  // Distances of 1e4 at tau 1: e^-10000 is 0 in double, the shifted weights are not.
  const float far[2] = {10000, 10001};
  const int32_t fv[2] = {2, 4};
  CHECK(knn_log_prob(std::log(0.5), 2, far, fv, 2, 0.5, 1) ==
        doctest::Approx(std::log(0.5 / (1 + std::exp(-1.0)) + 0.25)).epsilon(1e-12));
  // No neighbour at all: the model alone.
  const int32_t none[2] = {-1, -1};
  CHECK(knn_log_prob(std::log(p_lm), 2, d, none, 2, 0.5, 1) == std::log(p_lm));
}

TEST_CASE("knn_mix_logits: log of the mixed distribution over the vocabulary; lambda 0 leaves the logits") {
  const std::vector<Scalar> logits{1.0f, -0.5f, 2.0f, 0.25f, -3.0f};
  const float d[3] = {0.5f, 1.5f, 0.75f};
  const int32_t v[3] = {4, 0, 4};
  std::vector<Scalar> mixed = logits;
  knn_mix_logits(mixed.data(), 5, d, v, 3, 0.4, 0.5);
  double z_lm = 0;
  for (Scalar l : logits) z_lm += std::exp(static_cast<double>(l));
  const double z = std::exp(-1.0) + std::exp(-3.0) + std::exp(-1.5);
  const double p_knn[5] = {std::exp(-3.0) / z, 0, 0, 0, (std::exp(-1.0) + std::exp(-1.5)) / z};
  double total = 0;
  for (int i = 0; i < 5; ++i) {
    CAPTURE(i);
    const double p = 0.4 * p_knn[i] + 0.6 * std::exp(static_cast<double>(logits[i])) / z_lm;
    CHECK(mixed[i] == doctest::Approx(std::log(p)).epsilon(1e-6));
    total += std::exp(static_cast<double>(mixed[i]));
  }
  CHECK(total == doctest::Approx(1).epsilon(1e-6));
  std::vector<Scalar> same = logits;
  knn_mix_logits(same.data(), 5, d, v, 3, 0, 0.5);
  CHECK(same == logits);
  // lambda 1: tokens no neighbour has get the lowest float (sampled never), not -inf.
  knn_mix_logits(same.data(), 5, d, v, 3, 1, 0.5);
  CHECK(same[1] == std::numeric_limits<Scalar>::lowest());
  CHECK(std::exp(static_cast<double>(same[0])) + std::exp(static_cast<double>(same[4])) == doctest::Approx(1));
}

TEST_CASE("eval --knn: lambda 0 is the model's loss bit for bit; lambda > 0 matches a brute-force recomputation") {
  TempDir dir("knn-eval");
  const std::string ckpt = make_checkpoint(dir, "a", 1);
  const std::string data = write_text(dir, "text.txt", kText);
  const std::string val = write_text(dir, "val.txt", "the log sat on the cat; a dog ran by the mat.\n");
  const std::string store = build_store(ckpt, data, (dir.path / "s.knn").string());

  EvalArgs plain;
  plain.checkpoint = ckpt;
  plain.data = val;
  EvalArgs zero = plain;
  zero.knn.store = store;
  zero.knn.lambda = 0;
  const EvalResult a = evaluate_file(plain), b = evaluate_file(zero);
  CHECK(b.loss == a.loss);  // bit for bit
  CHECK(b.tokens == a.tokens);

  // lambda 0.5, k 3, tau 0.7, recomputed here: the model's features and
  // logits per window, every key compared (the store's keys recomputed from
  // the training text the same way), the mixture summed in probabilities.
  EvalArgs mixed = zero;
  mixed.knn.lambda = 0.5;
  mixed.knn.k = 3;
  mixed.knn.temperature = 0.7;
  const EvalResult m = evaluate_file(mixed);
  CHECK(m.lm_loss == doctest::Approx(a.loss).epsilon(1e-5));
  CHECK(m.knn_keys == static_cast<int64_t>(kText.size()) - 1);

  Loaded l = load_model(ckpt);
  NoGradGuard no_grad;
  Rng unused(0);
  const int64_t C = 12;
  const auto features_of = [&](const std::vector<int32_t>& ids, std::vector<float>& keys, std::vector<Tensor>& logits) {
    for_each_window(ids, 16, 0, [&](const Window& w) {
      ModelContext ctx;
      ctx.features = true;
      const Var f = l.model->forward(w.ids, ctx);
      const Tensor fv = f.value().contiguous();
      keys.insert(keys.end(), fv.data(), fv.data() + w.len * C);
      logits.push_back(l.model->logits_from_features(f).value().contiguous());
    });
  };
  std::vector<float> keys, queries;
  std::vector<Tensor> unused_logits, val_logits;
  const std::vector<int32_t> train_ids = l.tokenizer->encode(kText), val_ids = l.tokenizer->encode(
      "the log sat on the cat; a dog ran by the mat.\n");
  features_of(train_ids, keys, unused_logits);
  features_of(val_ids, queries, val_logits);
  const int64_t V = l.tokenizer->vocab_size(), N = static_cast<int64_t>(train_ids.size()) - 1;
  double nll = 0;
  int64_t t = 0;
  for (const Tensor& lg : val_logits) {
    for (int64_t i = 0; i < lg.dim(1); ++i, ++t) {
      const int32_t y = val_ids[static_cast<size_t>(t + 1)];
      std::vector<std::pair<double, int64_t>> d;
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t c = 0; c < C; ++c) s += std::pow(queries[t * C + c] - keys[j * C + c], 2);
        d.push_back({s, j});
      }
      std::partial_sort(d.begin(), d.begin() + 3, d.end());
      double z = 0, zy = 0;
      for (int j = 0; j < 3; ++j) {
        const double w = std::exp(-d[j].first / 0.7);
        z += w;
        if (train_ids[static_cast<size_t>(d[j].second + 1)] == y) zy += w;
      }
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(lg.data()[i * V + v]));
      const double p_lm = std::exp(static_cast<double>(lg.data()[i * V + y])) / sum;
      nll -= std::log(0.5 * zy / z + 0.5 * p_lm);
    }
  }
  CHECK(t == m.tokens);
  CHECK(m.loss == doctest::Approx(nll / static_cast<double>(t)).epsilon(1e-5));
  CHECK(m.loss != doctest::Approx(m.lm_loss).epsilon(1e-3));  // the store changed something
}

TEST_CASE("eval --knn on a model with a segment memory: lambda 0 is its loss bit for bit, lambda > 0 runs") {
  TempDir dir("knn-memory");
  const std::string ckpt = make_checkpoint(dir, "xl", 4, kText, 8);
  const std::string data = write_text(dir, "text.txt", kText);
  const std::string store = build_store(ckpt, data, (dir.path / "s.knn").string(), "hnsw");
  EvalArgs plain;
  plain.checkpoint = ckpt;
  plain.data = data;
  EvalArgs zero = plain;
  zero.knn.store = store;
  zero.knn.lambda = 0;
  const EvalResult a = evaluate_file(plain);
  CHECK(evaluate_file(zero).loss == a.loss);
  // Evaluated on the text the store holds, each position's own key is at distance 0.
  EvalArgs mixed = zero;
  mixed.knn.lambda = 0.5;
  mixed.knn.k = 1;
  const EvalResult m = evaluate_file(mixed);
  CHECK(m.lm_loss == doctest::Approx(a.loss).epsilon(1e-5));
  CHECK(m.loss < std::log(2.0) + 1e-6);  // p >= 0.5 p_kNN(y) = 0.5 at every position
}

TEST_CASE("kNN stores: another model, other weights, another vocabulary, too few keys, bad options refused") {
  TempDir dir("knn-refuse");
  const std::string a = make_checkpoint(dir, "a", 1), b = make_checkpoint(dir, "b", 2);
  const std::string other = make_checkpoint(dir, "c", 1, kText + "XYZ");
  const std::string data = write_text(dir, "text.txt", kText);
  const std::string store = build_store(a, data, (dir.path / "s.knn").string(), "ivf");
  EvalArgs e;
  e.checkpoint = b;
  e.data = data;
  e.knn.store = store;
  expect_error([&] { evaluate_file(e); }, {"kNN store '" + store + "' was built from another model or other weights"});
  e.checkpoint = other;
  expect_error([&] { evaluate_file(e); }, {"was built with another vocabulary"});
  e.checkpoint = a;
  e.knn.k = static_cast<int64_t>(kText.size());
  expect_error([&] { evaluate_file(e); }, {"--knn-k ", " exceeds the ", " keys of kNN store '" + store + "'"});
  e.knn.k = 4;
  e.knn.lambda = 1.5;
  expect_error([&] { evaluate_file(e); }, {"--knn-lambda must be in [0, 1], got 1.5"});
  e.knn.lambda = 0.5;
  e.knn.temperature = 0;
  expect_error([&] { evaluate_file(e); }, {"--knn-temperature must be > 0, got 0"});
  e.knn.temperature = 1;
  e.knn.ef_search = 10;
  expect_error([&] { evaluate_file(e); }, {"--knn-ef-search applies to an hnsw store"});
  e.knn.ef_search = 0;
  e.knn.nprobe = 2;
  CHECK(std::isfinite(evaluate_file(e).loss));
  // The fingerprint sees one weight change.
  Loaded l = load_model(a);
  const uint64_t before = model_fingerprint(l.cfg, *l.model);
  Var w = l.model->parameters()[0];
  w.value().data()[0] += 1e-3f;
  CHECK(model_fingerprint(l.cfg, *l.model) != before);
  // A kind's option at its default counts as absent (an option added later
  // leaves older stores valid); set to another value, it counts.
  const uint64_t weights_changed = model_fingerprint(l.cfg, *l.model);
  l.cfg.model.options["xmem_gate_bias"] = 0.0;
  CHECK(model_fingerprint(l.cfg, *l.model) == weights_changed);
  l.cfg.model.options["xmem_gate_bias"] = -2.0;
  CHECK(model_fingerprint(l.cfg, *l.model) != weights_changed);
}

TEST_CASE("sample --knn: lambda 0 draws the model's tokens; lambda 1 greedy follows the nearest key") {
  TempDir dir("knn-sample");
  const std::string ckpt = make_checkpoint(dir, "a", 3);
  const std::string data = write_text(dir, "text.txt", kText);
  const std::string store_path = build_store(ckpt, data, (dir.path / "s.knn").string());
  Loaded l = load_model(ckpt);
  KnnOptions opt;
  opt.store = store_path;
  opt.lambda = 0;
  opt.k = 2;
  const Datastore store = open_knn_store(opt, l.cfg, *l.model, *l.tokenizer);
  KnnHooks nothing_mixed(store, opt);
  const std::vector<int32_t> prompt = l.tokenizer->encode("the ");
  SampleOptions so;
  so.tokens = 10;
  so.seed = 5;
  Rng r1(5), r2(5);
  CHECK(generate(*l.model, prompt, so, r1, {}, {nullptr, &nothing_mixed}) == generate(*l.model, prompt, so, r2));

  opt.lambda = 1;
  opt.k = 1;
  so.temperature = 0;
  KnnHooks neighbours_only(store, opt);
  Rng r3(5);
  const std::vector<int32_t> seq = generate(*l.model, prompt, so, r3, {}, {nullptr, &neighbours_only});
  REQUIRE(seq.size() == prompt.size() + 10);
  NoGradGuard no_grad;
  ModelContext ctx;
  ctx.features = true;
  const Tensor f = l.model->forward(IndexTensor({1, static_cast<int64_t>(seq.size()) - 1},
                                                std::vector<int32_t>(seq.begin(), seq.end() - 1)),
                                    ctx)
                       .value()
                       .contiguous();
  for (size_t t = prompt.size() - 1; t + 1 < seq.size(); ++t) {
    CAPTURE(t);
    const Neighbours nb = store.index().search(f.data() + t * 12, 1, 1);
    CHECK(seq[t + 1] == store.values()[static_cast<size_t>(nb.ids[0])]);
  }
}

TEST_CASE("count_windows: the windows for_each_window reads, streams and records") {
  for (int64_t n : {0, 1, 2, 3, 9, 16, 17, 18, 33, 40}) {
    const std::vector<int32_t> ids(static_cast<size_t>(n), 1);
    for (int64_t T : {1, 4, 8, 16}) {
      for (int64_t align : {1, 9, 17}) {
        CAPTURE(n);
        CAPTURE(T);
        CAPTURE(align);
        if (align > 1 && n < T + 1) {  // records need one whole window
          CHECK(count_windows(n, T, align) == 0);
          continue;
        }
        int64_t calls = 0;
        for_each_window(ids, T, 0, [&](const Window&) { ++calls; }, align);
        CHECK(count_windows(n, T, align) == calls);
      }
    }
  }
  CHECK(whole_windows(65 * 3, 64, 65) == 3);
  CHECK(whole_windows(64, 64, 65) == 0);
}
