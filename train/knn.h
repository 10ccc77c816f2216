// kNN-LM (Khandelwal et al. 2020, "Generalization through Memorization:
// Nearest Neighbor Language Models"): a trained model's next-token
// distribution interpolated with one read off a datastore of (context
// vector, next token) pairs from a text, with no training.
//
//   tapeformer knn build --checkpoint RUN --data train.txt --out train.knn [--index ivf]
//   tapeformer eval --checkpoint RUN --data val.txt --knn train.knn [--knn-k 16 --knn-lambda 0.25]
//   tapeformer sample --checkpoint RUN --knn train.knn --prompt "ROMEO:"
//
// Keys are LanguageModel::features, the context vector f(x) the output head
// reads (TransformerLM: ln_f's output), at every position of the text, each
// with the token that follows it as its value. For a position with context
// vector q, the store's k nearest keys k_1 .. k_k by squared L2 distance
// d_i = ||q - k_i||^2, with values v_i, give
//   p_kNN(y) = sum_{i: v_i = y} exp(-d_i / tau) / sum_i exp(-d_i / tau)
//   p(y)     = lambda p_kNN(y) + (1 - lambda) p_LM(y)
// computed in logs: log p_kNN(y) = lse_{i: v_i = y}(-d_i / tau) - lse_i(-d_i / tau)
// and log p(y) = logaddexp(log lambda + log p_kNN(y), log(1 - lambda) + log p_LM(y)),
// each log-sum-exp shifted by its largest term, so no exp overflows or
// underflows to a wrong 0. lambda = 0 gives log p_LM(y) exactly (eval and
// sample then skip the search). A position whose search found no neighbour
// (an ivf query whose cells are empty) keeps p_LM. Of the keys the paper
// compares, the last layer's feed-forward input (after its layer norm) did
// best; here the key is the vector the head multiplies, which any model kind
// can expose through one interface (LanguageModel::features).
//
// A store holds the fingerprints of the model (its model.* config and every
// weight) and tokenizer it was built with: using it with another model,
// other weights or another vocabulary is refused, naming which.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tapeformer/data/tokenizer.h"
#include "tapeformer/layers/language_model.h"
#include "tapeformer/retrieval/datastore.h"
#include "tapeformer/train/config.h"
#include "tapeformer/train/model_hooks.h"
#include "tapeformer/train/sample.h"
#include "tapeformer/train/windows.h"

namespace tapeformer {

struct KnnOptions {
  std::string store;         // the datastore file; "" = kNN-LM off
  int64_t k = 16;            // neighbours per position, at most the store's keys
  double lambda = 0.25;      // weight of p_kNN, in [0, 1]
  double temperature = 1.0;  // tau > 0: distances are divided by it
  int64_t nprobe = 0;        // ivf: cells scanned per query (0: as the store was built)
  int64_t ef_search = 0;     // hnsw: candidates kept (0: as the store was built)
  bool on() const { return !store.empty(); }
  // Error naming the flag: k < 1, lambda outside [0, 1], temperature <= 0.
  void validate() const;
};

// FNV-1a 64 of the model.* config keys and every tensor of the model's
// state (name, shape, values): two models share it only when they compute
// the same features.
uint64_t model_fingerprint(const TrainConfig& cfg, const LanguageModel& model);
// FNV-1a 64 of the tokenizer's serialised state: the values' vocabulary.
uint64_t tokenizer_fingerprint(const Tokenizer& tokenizer);

// Loads opt.store and checks it against the model: refused (Error naming
// the file) when built with another tokenizer or vocabulary, another width,
// another model or other weights, or when it holds fewer than opt.k keys.
// Applies opt.nprobe / opt.ef_search.
Datastore open_knn_store(const KnnOptions& opt, const TrainConfig& cfg, const LanguageModel& model,
                         const Tokenizer& tokenizer);

// log p(target) of the mixture for one position: log_p_lm = log p_LM(target);
// distances (k) squared L2 and values (k) of its neighbours, -1 where none.
double knn_log_prob(double log_p_lm, int32_t target, const float* distances, const int32_t* values, int64_t k,
                    double lambda, double temperature);
// log softmax(logits)[y] of one position's logits (V), in double, shifted by
// the largest logit: the log p_LM that KnnEval and bench/knn_sweep mix.
double lm_log_prob(const Scalar* logits, int64_t V, int32_t y);

// The whole mixed distribution for one position: logits (V) of the model
// become log p(v) for every v (the lowest float where p(v) = 0, so that
// sampling draws it never). Logits that are not all finite are left as
// they are (sampling then refuses them).
void knn_mix_logits(Scalar* logits, int64_t V, const float* distances, const int32_t* values, int64_t k,
                    double lambda, double temperature);

// The values of a search's neighbours, (n, k), -1 where there is none.
std::vector<int32_t> neighbour_values(const Neighbours& nb, const Datastore& store);

// Sums kNN-LM losses over eval's windows (train/eval_file.h).
class KnnEval {
 public:
  KnnEval(const Datastore& store, const KnnOptions& opt) : store_(store), opt_(opt) {}
  // One window: features (1, W, C) and logits (1, W, V) of w.ids; the
  // positions after w.again are predicted (w.targets). Positions are
  // searched in blocks of kBlock (an ivf search shares each cell's reads
  // among a block's queries); finish() searches the last one.
  void add(const Tensor& features, const Tensor& logits, const Window& w);
  void finish();
  static constexpr int64_t kBlock = 1024;
  double loss_sum = 0;     // -sum log p(y), the mixture
  double lm_loss_sum = 0;  // -sum log p_LM(y), the model alone
  int64_t counted = 0;

 private:
  const Datastore& store_;
  const KnnOptions& opt_;
  std::vector<float> queries_;      // (n, C): the pending positions' context vectors
  std::vector<double> log_p_lm_;    // (n): log p_LM of each one's target
  std::vector<int32_t> targets_;    // (n)
  std::vector<int64_t> positions_;  // (n): where in the text, for errors
};

// Mixes p_kNN into one sampled token's distribution.
class KnnMixer {
 public:
  KnnMixer(const Datastore& store, const KnnOptions& opt) : store_(store), opt_(opt) {}
  // logits (V) at the position's features (C) -> log p of the mixture.
  void mix(const Scalar* features, int64_t C, Scalar* logits, int64_t V) const;

 private:
  const Datastore& store_;
  const KnnOptions& opt_;
};

// kNN-LM as a Mixture (train/model_hooks.h), which `eval` and `sample` add
// for --knn: every next-token distribution mixed with p_kNN (KnnEval's sums
// in evaluation, KnnMixer's distribution in sampling). With lambda = 0 it
// mixes nothing and the model's own path runs, bit for bit.
class KnnHooks : public Mixture {
 public:
  KnnHooks(const Datastore& store, const KnnOptions& opt) : opt_(opt), eval_(store, opt_), mixer_(store, opt_) {}
  bool mixes() const override { return opt_.lambda > 0; }
  void mix(const Scalar* features, int64_t C, Scalar* logits, int64_t V) const override {
    mixer_.mix(features, C, logits, V);
  }
  void score(const Tensor& features, const Tensor& logits, const Window& w) override { eval_.add(features, logits, w); }
  Sums finish() override {
    eval_.finish();
    return {eval_.loss_sum, eval_.lm_loss_sum, eval_.counted};
  }

 private:
  KnnOptions opt_;
  KnnEval eval_;
  KnnMixer mixer_;
};

// KnnHooks with the store they read: `eval`'s and `sample`'s --knn.
class KnnMixture : public Mixture {
 public:
  KnnMixture(Datastore store, const KnnOptions& opt) : store_(std::move(store)), hooks_(store_, opt) {}
  int64_t keys() const { return store_.size(); }
  bool mixes() const override { return hooks_.mixes(); }
  void mix(const Scalar* features, int64_t C, Scalar* logits, int64_t V) const override {
    hooks_.mix(features, C, logits, V);
  }
  void score(const Tensor& features, const Tensor& logits, const Window& w) override { hooks_.score(features, logits, w); }
  Sums finish() override { return hooks_.finish(); }

 private:
  Datastore store_;
  KnnHooks hooks_;
};

// The store opt names, opened and checked against the model
// (open_knn_store), or null when opt.on() is false.
std::unique_ptr<KnnMixture> knn_mixture(const KnnOptions& opt, const TrainConfig& cfg, const LanguageModel& model,
                                        const Tokenizer& tokenizer);

struct KnnBuildArgs {
  std::string checkpoint;     // run directory or checkpoint file
  std::string weights;        // a safetensors file replacing the checkpoint's weights (optional)
  std::string data;           // the text whose positions become keys
  std::string split = "all";  // all | train | val (the checkpoint's data.val_fraction)
  std::string out;            // the store file to write
  int64_t context = 0;        // window length in tokens (0: block size), as eval's
  IndexOptions index;
};

// Reads args.data through the model as eval does (carrying a segment
// memory; with the run's data.align, its records), a key for every
// predicted position, builds the index and writes the store atomically.
// Within a command's ProgressScope (train/metrics.h) the reading and then
// the indexing and writing show their progress on stderr.
Datastore build_knn_store(const KnnBuildArgs& args);

}  // namespace tapeformer
