// A non-causal use of Linformer (layers/attention/linformer.h): an encoder
// that reads a whole sequence and classifies it. The task: each sequence of
// --length symbols (8 of them) has one symbol planted at 30% of the
// positions, the others uniform; the label is the planted symbol. Every
// position may attend to every other (ModelConfig::causal = false), which is
// what Linformer's projections along the sequence need.
//
//   build/examples/linformer_encoder --attention linformer --length 512 --steps 300 [--k 64] [--seed 1]
//   build/examples/linformer_encoder --attention full ...     # non-causal softmax attention, T x T
//
// Model: token + learned position embeddings, --layers pre-LN blocks
// (attention, then the MLP), a final LayerNorm, the mean over positions and
// a linear head; AdamW at 1e-3 on batches of 16. Prints one JSON line:
// {"attention", "length", "accuracy" (on 512 fresh sequences), "train_loss",
//  "ms_per_step", "params"}.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "bench/bench_common.h"
#include "tapeformer/commands/flags.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/layers/attention/linformer.h"
#include "tapeformer/layers/basic.h"
#include "tapeformer/layers/block/standard.h"
#include "tapeformer/optim/clip.h"
#include "tapeformer/train/build.h"

using namespace tapeformer;

namespace {

constexpr int32_t kSymbols = 8;

// Bidirectional softmax attention, the baseline: q, k, v, softmax over all T keys.
class FullAttention : public Module {
 public:
  FullAttention(int64_t C, int64_t H, Rng& rng) : H_(H) {
    qkv = register_module("qkv", std::make_shared<Linear>(C, 3 * C, true, rng));
    proj = register_module("proj", std::make_shared<Linear>(C, C, true, rng));
  }
  Var forward(const Var& x) const {
    const std::vector<Var> h = split_heads(qkv->forward(x), H_);  // (B, H, T, D)
    AttentionSpec bidirectional;
    bidirectional.causal = false;
    return proj->forward(merge_heads(softmax_attention(h[0], h[1], h[2], bidirectional)));
  }

 private:
  int64_t H_;
  std::shared_ptr<Linear> qkv, proj;
};

class Encoder : public Module {
 public:
  Encoder(const ModelConfig& cfg, bool linformer, Rng& rng) {
    tok = register_module("tok", std::make_shared<Embedding>(kSymbols, cfg.n_embd, rng));
    Tensor p = Tensor::empty({cfg.block_size, cfg.n_embd});
    rng.fill_normal(p, 0.0f, 0.02f);
    pos = register_parameter("pos", p);
    for (int64_t l = 0; l < cfg.n_layer; ++l) {
      const std::string n = std::to_string(l);
      ln1.push_back(register_module("ln_1_" + n, std::make_shared<LayerNorm>(cfg.n_embd, true)));
      if (linformer) {
        linformer_attn.push_back(register_module(
            "attn_" + n, std::make_shared<LinformerAttention>(cfg, std::make_shared<PositionalLayer>(), rng)));
      } else {
        full_attn.push_back(register_module("attn_" + n, std::make_shared<FullAttention>(cfg.n_embd, cfg.n_head, rng)));
      }
      ln2.push_back(register_module("ln_2_" + n, std::make_shared<LayerNorm>(cfg.n_embd, true)));
      mlp.push_back(register_module(
          "mlp_" + n, std::make_shared<FeedForward>(cfg.n_embd, 4 * cfg.n_embd, true, 0.0f, "gelu", 0.02f, rng)));
    }
    ln_f = register_module("ln_f", std::make_shared<LayerNorm>(cfg.n_embd, true));
    head = register_module("head", std::make_shared<Linear>(cfg.n_embd, kSymbols, true, rng));
  }

  // ids (B, T) -> logits (B, symbols).
  Var forward(const IndexTensor& ids, Rng& rng) const {
    const int64_t T = ids.shape[1];
    Var x = add(tok->forward(ids), slice(pos, 0, 0, T));  // (B, T, C)
    for (size_t l = 0; l < ln1.size(); ++l) {
      const Var a = ln1[l]->forward(x);
      x = add(x, linformer_attn.empty() ? full_attn[l]->forward(a) : linformer_attn[l]->forward(a, rng));
      x = add(x, mlp[l]->forward(ln2[l]->forward(x), rng));
    }
    return head->forward(mean(ln_f->forward(x), {1}));  // (B, symbols)
  }

 private:
  std::shared_ptr<Embedding> tok;
  Var pos;  // (block_size, C)
  std::vector<std::shared_ptr<LayerNorm>> ln1, ln2;
  std::vector<std::shared_ptr<LinformerAttention>> linformer_attn;
  std::vector<std::shared_ptr<FullAttention>> full_attn;
  std::vector<std::shared_ptr<FeedForward>> mlp;
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> head;
};

// B sequences of T symbols and their labels.
std::pair<IndexTensor, IndexTensor> batch(int64_t B, int64_t T, Rng& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(B * T)), labels(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const auto c = static_cast<int32_t>(rng.below(kSymbols));
    labels[static_cast<size_t>(b)] = c;
    for (int64_t t = 0; t < T; ++t) {
      const auto other = static_cast<int32_t>(rng.below(kSymbols - 1));
      ids[static_cast<size_t>(b * T + t)] = rng.uniform() < 0.3f ? c : (other >= c ? other + 1 : other);
    }
  }
  return {IndexTensor({B, T}, ids), IndexTensor({B}, labels)};
}

int run(int argc, char** argv) {
  CLI::App app{"A non-causal encoder with Linformer (or full) attention, classifying sequences"};
  std::string attention = "linformer";
  int64_t length = 512, steps = 300, k = 64, layers = 2, width = 64, heads = 4;
  uint64_t seed = 1;  // the Rng's type, so --seed -1 is refused rather than taken as 2^64 - 1
  int threads = 0;    // parallel::set_num_threads's type: no narrowing after the flag's check
  app.add_option("--attention", attention, "linformer | full")->capture_default_str();
  number_option(&app, "--length", length, "sequence length T")->capture_default_str();
  number_option(&app, "--steps", steps, "training steps (batches of 16)")->capture_default_str();
  number_option(&app, "--k", k, "linformer: projected length")->capture_default_str();
  number_option(&app, "--layers", layers, "encoder blocks")->capture_default_str();
  number_option(&app, "--width", width, "model width")->capture_default_str();
  number_option(&app, "--seed", seed, "weights and data")->capture_default_str();
  number_option(&app, "--threads", threads, "0: all")->capture_default_str();
  check_number_options(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  TAPEFORMER_CHECK(attention == "linformer" || attention == "full", "--attention must be linformer or full, got ",
                   attention);
  TAPEFORMER_CHECK(length >= 2 && steps >= 1, "--length must be >= 2 and --steps >= 1");
  parallel::set_num_threads(threads);
  ModelConfig cfg;
  cfg.block_size = length;
  cfg.n_layer = layers;
  cfg.n_head = heads;
  cfg.n_embd = width;
  cfg.causal = false;  // an encoder: every position sees every other
  cfg.attention = "linformer";
  cfg.options["linformer_k"] = k;
  cfg.validate_kinds();
  Rng rng(seed), data(seed + 1);
  Encoder model(cfg, attention == "linformer", rng);
  OptimizerConfig oc;
  oc.lr = 1e-3;
  oc.weight_decay = 0.0;
  const auto opt = make_optimizer(oc, model.named_parameters());
  double loss = 0, seconds = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const auto [ids, labels] = batch(16, length, data);
    const auto t0 = std::chrono::steady_clock::now();
    {
      TapeScope tape;
      const Var l = cross_entropy(model.forward(ids, rng), labels);
      backward(l);
      loss = l.item();
    }
    opt->step(clip_coefficient(grad_norm(model.parameters()), 1.0f));
    opt->zero_grad();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Rng eval(seed + 1000);
  int64_t right = 0, total = 0;
  model.eval();
  NoGradGuard no_grad;
  for (int i = 0; i < 32; ++i) {
    const auto [ids, labels] = batch(16, length, eval);
    const Tensor logits = model.forward(ids, rng).value();  // (16, symbols)
    for (int64_t b = 0; b < 16; ++b) {
      int32_t best = 0;
      for (int32_t c = 1; c < kSymbols; ++c)
        if (logits.at({b, c}) > logits.at({b, best})) best = c;
      right += best == labels.data[static_cast<size_t>(b)];
      ++total;
    }
  }
  std::printf("{\"attention\": \"%s\", \"length\": %lld, \"k\": %lld, \"accuracy\": %.4f, \"train_loss\": %.5f, "
              "\"ms_per_step\": %.2f, \"params\": %lld}\n",
              attention.c_str(), static_cast<long long>(length), static_cast<long long>(k),
              static_cast<double>(right) / static_cast<double>(total), loss, 1e3 * seconds / static_cast<double>(steps),
              static_cast<long long>(model.num_parameters()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return bench::guarded_main("linformer_encoder", run, argc, argv); }
