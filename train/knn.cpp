#include "tapeformer/train/knn.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/train/load_model.h"
#include "tapeformer/core/program_name.h"
#include "tapeformer/train/evaluator.h"
#include "tapeformer/train/metrics.h"
#include "tapeformer/train/run_directory.h"

namespace tapeformer {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// log(e^a + e^b), exact when either is -inf (then the other is returned as it is).
double logaddexp(double a, double b) {
  if (a == kNegInf) return b;
  if (b == kNegInf) return a;
  const double m = std::max(a, b);
  return m + std::log1p(std::exp(std::min(a, b) - m));
}

// The neighbours' scores s_i = -d_i / tau, shifted by their maximum, as
// weights w_i = e^(s_i - max s) (the largest is 1): p_kNN(v) = sum_{v_i = v} w_i / sum_i w_i.
// Returns sum_i w_i; 0 when no neighbour was found.
double neighbour_weights(const float* distances, const int32_t* values, int64_t k, double temperature,
                         std::vector<double>& w) {
  w.assign(static_cast<size_t>(k), 0.0);
  double top = kNegInf;
  for (int64_t i = 0; i < k; ++i)
    if (values[i] >= 0) top = std::max(top, -static_cast<double>(distances[i]) / temperature);
  if (top == kNegInf) return 0;
  double z = 0;
  for (int64_t i = 0; i < k; ++i)
    if (values[i] >= 0) z += w[i] = std::exp(-static_cast<double>(distances[i]) / temperature - top);
  return z;
}

}  // namespace

void KnnOptions::validate() const {
  TAPEFORMER_CHECK(k >= 1, "--knn-k must be >= 1, got ", k);
  TAPEFORMER_CHECK(lambda >= 0 && lambda <= 1, "--knn-lambda must be in [0, 1], got ", lambda);
  TAPEFORMER_CHECK(temperature > 0 && std::isfinite(temperature), "--knn-temperature must be > 0, got ", temperature);
  TAPEFORMER_CHECK(nprobe >= 0 && ef_search >= 0, "--knn-nprobe and --knn-ef-search must be >= 0");
}

uint64_t model_fingerprint(const TrainConfig& cfg, const LanguageModel& model) {
  // Kind-specific keys (attention, positional, block, MLP and model kinds'
  // options) at their defaults are left out, so that an option added later
  // leaves the stores built before it valid.
  std::set<std::string> defaults;
  for (const DeclaredOption& d : model_options()) {
    const auto it = cfg.model.options.find(d.option.name);
    if (it == cfg.model.options.end() || it->second == d.option.default_value) defaults.insert("model." + d.option.name);
  }
  uint64_t h = kFnvOffset;
  for (const auto& [key, value] : cfg.fields()) {
    if (key.rfind("model.", 0) != 0 || defaults.count(key) != 0) continue;
    h = fnv1a64(key.data(), key.size() + 1, h);  // with its NUL: "a" + "bc" differs from "ab" + "c"
    h = fnv1a64(value.data(), value.size() + 1, h);
  }
  for (const auto& [name, t] : model.state()) {
    h = fnv1a64(name.data(), name.size() + 1, h);
    const std::vector<int64_t> dims = t.shape().to_vector();
    h = fnv1a64(reinterpret_cast<const char*>(dims.data()), dims.size() * sizeof(int64_t), h);
    const Tensor c = t.contiguous();
    h = fnv1a64(reinterpret_cast<const char*>(c.data()), static_cast<size_t>(c.numel()) * sizeof(Scalar), h);
  }
  return h;
}

uint64_t tokenizer_fingerprint(const Tokenizer& tokenizer) { return fnv1a64(save_tokenizer(tokenizer)); }

std::unique_ptr<KnnMixture> knn_mixture(const KnnOptions& opt, const TrainConfig& cfg, const LanguageModel& model,
                                        const Tokenizer& tokenizer) {
  if (!opt.on()) return nullptr;
  return std::make_unique<KnnMixture>(open_knn_store(opt, cfg, model, tokenizer), opt);
}

Datastore open_knn_store(const KnnOptions& opt, const TrainConfig& cfg, const LanguageModel& model,
                         const Tokenizer& tokenizer) {
  opt.validate();
  Datastore store = Datastore::load(opt.store);
  const DatastoreInfo& info = store.info();
  const std::string origin = "kNN store '" + opt.store + "'";
  const std::string rebuild = ": build one for this checkpoint with " + program_name() + " knn build";
  TAPEFORMER_CHECK(info.vocab_size == tokenizer.vocab_size() && info.tokenizer_fingerprint == tokenizer_fingerprint(tokenizer),
                   origin, " was built with another vocabulary (", info.vocab_size, " tokens, tokenizer ",
                   hex64(info.tokenizer_fingerprint), "; this model's: ", tokenizer.vocab_size(), " tokens, tokenizer ",
                   hex64(tokenizer_fingerprint(tokenizer)), ")", rebuild);
  TAPEFORMER_CHECK(info.dim == cfg.model.n_embd, origin, " holds keys of width ", info.dim,
                   ", but this model's context vectors have ", cfg.model.n_embd, " (model.n_embd)", rebuild);
  const uint64_t fp = model_fingerprint(cfg, model);
  TAPEFORMER_CHECK(info.model_fingerprint == fp, origin, " was built from another model or other weights (model ",
                   hex64(info.model_fingerprint), ", this one ", hex64(fp), ")", rebuild);
  TAPEFORMER_CHECK(opt.k <= store.size(), "--knn-k ", opt.k, " exceeds the ", store.size(), " keys of ", origin);
  const IndexOptions& built = store.index().options();
  const std::string kind = built.kind;
  TAPEFORMER_CHECK(opt.nprobe == 0 || kind == "ivf", "--knn-nprobe applies to an ivf store; ", origin, " is ",
                   built.describe());
  TAPEFORMER_CHECK(opt.ef_search == 0 || kind == "hnsw", "--knn-ef-search applies to an hnsw store; ", origin,
                   " is ", built.describe());
  try {
    store.index().set_search_options(opt.nprobe > 0 ? opt.nprobe : built.nprobe,
                                     opt.ef_search > 0 ? opt.ef_search : built.ef_search);
  } catch (const Error& e) {
    fail(origin, ": ", e.what());
  }
  return store;
}

double knn_log_prob(double log_p_lm, int32_t target, const float* distances, const int32_t* values, int64_t k,
                    double lambda, double temperature) {
  if (lambda == 0) return log_p_lm;
  std::vector<double> w;
  const double z = neighbour_weights(distances, values, k, temperature, w);
  if (z == 0) return log_p_lm;  // no neighbour found: the model alone
  double zy = 0;
  for (int64_t i = 0; i < k; ++i)
    if (values[i] == target) zy += w[i];
  const double log_p_knn = zy > 0 ? std::log(zy) - std::log(z) : kNegInf;
  return logaddexp(std::log(lambda) + log_p_knn, std::log1p(-lambda) + log_p_lm);
}

void knn_mix_logits(Scalar* logits, int64_t V, const float* distances, const int32_t* values, int64_t k,
                    double lambda, double temperature) {
  if (lambda == 0) return;
  for (int64_t v = 0; v < V; ++v)
    if (!std::isfinite(logits[v])) return;  // sampling refuses them, naming the token
  std::vector<double> w;
  const double z = neighbour_weights(distances, values, k, temperature, w);
  if (z == 0) return;
  std::vector<double> p_knn(static_cast<size_t>(V), 0.0);
  for (int64_t i = 0; i < k; ++i)
    if (values[i] >= 0 && values[i] < V) p_knn[static_cast<size_t>(values[i])] += w[i] / z;
  double top = logits[0];
  for (int64_t v = 1; v < V; ++v) top = std::max<double>(top, logits[v]);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits[v]) - top);
  const double lse = top + std::log(sum), log_lambda = std::log(lambda), log_rest = std::log1p(-lambda);
  for (int64_t v = 0; v < V; ++v) {
    const double a = p_knn[v] > 0 ? log_lambda + std::log(p_knn[v]) : kNegInf;
    const double lp = logaddexp(a, log_rest + (static_cast<double>(logits[v]) - lse));
    logits[v] = lp == kNegInf ? std::numeric_limits<Scalar>::lowest() : static_cast<Scalar>(lp);
  }
}

std::vector<int32_t> neighbour_values(const Neighbours& nb, const Datastore& store) {
  std::vector<int32_t> values(nb.ids.size(), -1);
  const std::vector<int32_t>& all = store.values();
  for (size_t i = 0; i < nb.ids.size(); ++i)
    if (nb.ids[i] >= 0 && nb.ids[i] < static_cast<int64_t>(all.size())) values[i] = all[static_cast<size_t>(nb.ids[i])];
  return values;
}

double lm_log_prob(const Scalar* logits, int64_t V, int32_t y) {
  double top = logits[0];
  for (int64_t v = 1; v < V; ++v) top = std::max<double>(top, logits[v]);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits[v]) - top);
  return static_cast<double>(logits[y]) - top - std::log(sum);
}

void KnnEval::add(const Tensor& features, const Tensor& logits, const Window& w) {
  const int64_t C = features.dim(2), V = logits.dim(2);
  const Tensor f = features.contiguous(), l = logits.contiguous();
  queries_.insert(queries_.end(), f.data() + w.again * C, f.data() + (w.again + w.len) * C);
  for (int64_t t = 0; t < w.len; ++t) {
    const Scalar* row = l.data() + (w.again + t) * V;  // (V)
    const int32_t y = w.targets.data[static_cast<size_t>(w.again + t)];
    log_p_lm_.push_back(lm_log_prob(row, V, y));
    targets_.push_back(y);
    positions_.push_back(w.start + t + 1);
  }
  if (static_cast<int64_t>(targets_.size()) >= kBlock) finish();
}

void KnnEval::finish() {
  const auto n = static_cast<int64_t>(targets_.size());
  if (n == 0) return;
  const int64_t k = opt_.k;
  const Neighbours nb = store_.index().search(queries_.data(), n, k);  // queries (n, C)
  const std::vector<int32_t> values = neighbour_values(nb, store_);
  for (int64_t t = 0; t < n; ++t) {
    const double lp = knn_log_prob(log_p_lm_[static_cast<size_t>(t)], targets_[static_cast<size_t>(t)],
                                   nb.distances.data() + t * k, values.data() + t * k, k, opt_.lambda,
                                   opt_.temperature);
    TAPEFORMER_CHECK(lp > kNegInf, "eval: with --knn-lambda ", opt_.lambda, " the token at position ",
                     positions_[static_cast<size_t>(t)], " has probability 0 (none of its ", k,
                     " neighbours has it): the loss is infinite; use a --knn-lambda below 1");
    loss_sum -= lp;
    lm_loss_sum -= log_p_lm_[static_cast<size_t>(t)];
  }
  counted += n;
  queries_.clear();
  log_p_lm_.clear();
  targets_.clear();
  positions_.clear();
}

void KnnMixer::mix(const Scalar* features, int64_t C, Scalar* logits, int64_t V) const {
  if (opt_.lambda == 0) return;  // the model's logits, untouched
  const Neighbours nb = store_.index().search(features, 1, opt_.k);
  const std::vector<int32_t> values = neighbour_values(nb, store_);
  knn_mix_logits(logits, V, nb.distances.data(), values.data(), opt_.k, opt_.lambda, opt_.temperature);
}

Datastore build_knn_store(const KnnBuildArgs& args) {
  TAPEFORMER_CHECK(!args.out.empty(), "knn build: --out is required");
  TAPEFORMER_CHECK(args.context >= 0, "knn build: context must be >= 0 (0: the block size), got ", args.context);
  args.index.validate();
  const std::string checkpoint =
      std::filesystem::is_directory(args.checkpoint) ? args.checkpoint + "/checkpoint.bin" : args.checkpoint;
  RunDirectory::check_output("knn build", args.out, {checkpoint, args.weights, args.data});
  remove_stale_temp_files(args.out);  // what a killed build left beside it
  Loaded l = load_model(args.checkpoint, args.weights);
  const int64_t limit = l.model->max_positions();
  const int64_t T = args.context > 0 ? args.context : l.cfg.model.block_size;
  TAPEFORMER_CHECK(limit < 0 || T <= limit, "knn build: context ", T, " exceeds the ", limit,
                   " positions of model.positional \"", l.cfg.model.positional, "\"");
  EvalText text = read_eval_text(args.data, *l.tokenizer, args.split, l.cfg.data.val_fraction);
  text.align = l.cfg.data.align;  // records of a fixed length: the windows the run trained on
  const int64_t C = l.cfg.model.n_embd;
  DatastoreInfo info;
  info.model_fingerprint = model_fingerprint(l.cfg, *l.model);
  info.tokenizer_fingerprint = tokenizer_fingerprint(*l.tokenizer);
  info.vocab_size = l.tokenizer->vocab_size();
  info.dim = C;
  info.source = args.data + (args.split == "all" ? "" : " (" + args.split + " split)");
  if (info.source.size() > 4096) info.source.resize(4096);
  Datastore store(info, args.index);
  HookSite site;
  site.cfg = &l.cfg;
  site.tokenizer = l.tokenizer.get();
  const std::unique_ptr<ModelHooks> hooks = make_model_hooks(site);  // the model kind's extra inputs
  Evaluator(*l.model, {hooks.get()}).read_text(text, T, l.cfg.eval.mem_len, /*features=*/true,
                                               [&](const Window& w, const Var& features) {
    const Tensor f = features.value().contiguous();  // (1, W, C)
    for (int64_t t = 0; t < w.len; ++t)
      TAPEFORMER_CHECK(std::isfinite(f.data()[(w.again + t) * C]), "knn build: the model's context vector at position ",
                       w.start + t, " is not finite: the weights are not usable");
    store.add(f.data() + w.again * C, w.targets.data.data() + w.again, w.len);
  });
  WorkProgress indexing("building an " + args.index.describe() + " index of " + grouped(store.size()) +
                            " keys and writing '" + args.out + "'",
                        0, "");
  store.finish();
  store.save(args.out);
  indexing.done();
  return store;
}

}  // namespace tapeformer
