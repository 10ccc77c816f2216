// A layer written outside the library (examples/custom_layer/): SwiGLU
// feed-forward blocks (Shazeer 2020), FFN(x) = (silu(x W_a) * (x W_b)) W_2,
// with the gate as a fused op through the public Function API, registered as
// block kind "swiglu" and trained by the library's Trainer from a config.
// Exit status 0 when the op gradchecks, the fused block equals its
// composition, its feed-forward through activation recompute gives the same
// gradient bits and gradchecks, the parameter count comes out right, and
// training learns, with train.recompute=blocks to the same bits.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "tapeformer/autograd/function.h"
#include "tapeformer/autograd/gradcheck.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/recompute.h"
#include "tapeformer/layers/block/sequential.h"
#include "tapeformer/layers/block/standard.h"
#include "tapeformer/layers/transformer.h"
#include "tapeformer/train/trainer.h"

using namespace tapeformer;
namespace fs = std::filesystem;

// y = silu(a) * b = a sigmoid(a) b, elementwise.
//   da = g b sigmoid(a) (1 + a (1 - sigmoid(a))),  db = g a sigmoid(a)
struct SiluGate : Function {
  const char* name() const override { return "silu_gate"; }
  std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& in) override {
    ctx.save_for_backward({in[0], in[1]});
    const Var a(in[0]), b(in[1]);
    return {mul(mul(a, sigmoid(a)), b).value()};
  }
  std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& dout) override {
    const Var a(ctx.saved()[0]), b(ctx.saved()[1]), g(dout[0]);
    const Var s = sigmoid(a);
    const Var da = mul(mul(g, mul(b, s)), add_scalar(mul(a, add_scalar(neg(s), 1.0f)), 1.0f));
    const Var db = mul(g, mul(a, s));
    return {da.value(), db.value()};
  }
};

Var silu_gate(const Var& a, const Var& b) { return Function::apply<SiluGate>({a, b})[0]; }

// A pre-LN block with attention from the config's kind and a SwiGLU FFN of
// hidden width F = 8C/3 (rounded to a multiple of 8), the same parameters as a 4C MLP.
class SwiGLUBlock : public Module {
 public:
  SwiGLUBlock(const ModelConfig& cfg, const Positional& positional, Rng& rng)
      : hidden_(hidden_width(cfg.n_embd)) {
    ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
    attn = register_module("attn", make_attention(cfg, positional.make_layer(rng), rng));
    ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.n_embd, cfg.bias));
    gate = register_module("gate", std::make_shared<Linear>(cfg.n_embd, 2 * hidden_, false, rng));  // [W_a | W_b]
    proj = register_module("proj", std::make_shared<Linear>(hidden_, cfg.n_embd, false, rng, residual_init_std(cfg)));
  }
  static int64_t hidden_width(int64_t C) { return (8 * C / 3 + 7) / 8 * 8; }

  Var ffn(const Var& x, bool fused = true) const {
    const Var ab = gate->forward(ln_2->forward(x));  // (B, T, 2F)
    const Var a = slice(ab, 2, 0, hidden_), b = slice(ab, 2, hidden_, 2 * hidden_);
    return proj->forward(fused ? silu_gate(a, b) : mul(mul(a, sigmoid(a)), b));  // (B, T, C)
  }
  Var forward(const Var& x_in, Rng& rng) const { return forward(x_in, Tensor(), rng); }
  Var forward(const Var& x_in, const Tensor& memory, Rng& rng) const {  // memory: Transformer-XL's, or none
    const Var x = add(x_in, attend_normalised(*attn, *ln_1, x_in, memory, rng));
    return add(x, ffn(x));
  }
  std::unique_ptr<InferenceState> make_state(int64_t batch, int64_t window) const {
    return attn->make_state(batch, window);
  }
  Var forward(const Var& x_in, InferenceState& state) const {
    const Var x = add(x_in, attn->forward(ln_1->forward(x_in), state));
    return add(x, ffn(x));
  }

  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<Linear> gate, proj;

 private:
  int64_t hidden_;
};

BlockKind swiglu_block_kind() {
  BlockKind kind;
  kind.name = "swiglu";
  kind.summary = "pre-LN blocks with a SwiGLU feed-forward (examples/custom_layer)";
  kind.make = [](const ModelConfig& cfg, const Positional& positional, Rng& rng) {
    return std::make_shared<SequentialStack<SwiGLUBlock>>(cfg, positional, rng);
  };
  kind.parameters = [](const ModelConfig& cfg) {
    const double C = static_cast<double>(cfg.n_embd), F = static_cast<double>(SwiGLUBlock::hidden_width(cfg.n_embd));
    const double norms = 2 * (C + (cfg.bias ? C : 0));
    return static_cast<double>(cfg.n_layer) * (norms + attention_kinds().get(cfg.attention).parameters(cfg) + 3 * C * F);
  };
  kind.check = [](const ModelConfig&) {};
  return kind;
}

int failed(const std::string& what) {
  std::fprintf(stderr, "custom_layer: FAIL: %s\n", what.c_str());
  return 1;
}

int main() {
  try {
    block_kinds().add(swiglu_block_kind());

    // 1. The fused gate against finite differences.
    Rng rng(1);
    Tensor a = Tensor::empty({3, 4}), b = Tensor::empty({3, 4});
    rng.fill_normal(a, 0.0f, 1.0f);
    rng.fill_normal(b, 0.0f, 1.0f);
    const GradcheckResult g = gradcheck([](const std::vector<Var>& v) { return silu_gate(v[0], v[1]); }, {a, b},
                                        "silu_gate");
    if (!g.ok) return failed(g.message);

    // 2. A model of the new kind: its parameter count, and the fused block equal to its composition.
    ModelConfig cfg;
    cfg.vocab_size = 11;
    cfg.n_layer = 2;
    cfg.n_embd = 24;
    cfg.n_head = 2;
    cfg.block_size = 16;
    cfg.block = "swiglu";
    TransformerLM model(cfg, rng);
    if (TransformerLM::footprint(cfg).parameters != static_cast<double>(model.num_parameters()))
      return failed("parameter count from the kind differs from the built model's");
    const auto& block = *std::dynamic_pointer_cast<SequentialStack<SwiGLUBlock>>(model.stack)->blocks[0];
    Tensor x = Tensor::empty({2, 5, 24});
    rng.fill_normal(x, 0.0f, 1.0f);
    const auto run_ffn = [&](bool fused) {  // output and input gradient for a fixed upstream gradient
      Var xv(x, /*requires_grad=*/true);
      const Var y = block.ffn(xv, fused);
      backward(sum(mul(y, Var(x))));  // upstream gradient: x itself
      return std::make_pair(y.value().to_vector(), xv.grad().to_vector());
    };
    const auto [y_fused, dx_fused] = run_ffn(true);
    const auto [y_plain, dx_plain] = run_ffn(false);
    double worst = 0;
    for (size_t i = 0; i < y_fused.size(); ++i)
      worst = std::max({worst, std::abs(double(y_fused[i]) - y_plain[i]), std::abs(double(dx_fused[i]) - dx_plain[i])});
    if (!(worst < 1e-5)) return failed("fused and composed SwiGLU differ by " + std::to_string(worst));

    // 2b. The feed-forward through recompute (autograd/recompute.h): only its input is kept, and
    //     it runs again in the backward. The block outlives the backward, so fn may hold it by reference.
    const auto ffn_gradients = [&](bool recomputed) {
      for (Var p : model.parameters()) p.zero_grad();
      Var xv(x, /*requires_grad=*/true);
      const Var y = recomputed ? recompute([&block](const std::vector<Var>& in) { return std::vector<Var>{block.ffn(in[0])}; },
                                           {xv})[0]
                               : block.ffn(xv);
      backward(sum(mul(y, Var(x))));
      std::vector<float> all = xv.grad().to_vector();
      for (const Var& w : {block.gate->weight, block.proj->weight})
        for (float v : w.grad().to_vector()) all.push_back(v);
      return all;
    };
    if (ffn_gradients(true) != ffn_gradients(false)) return failed("the recomputed feed-forward's gradients differ");
    const GradcheckResult gr = gradcheck_vars(
        [&] {
          const Var y = recompute([&block](const std::vector<Var>& in) { return std::vector<Var>{block.ffn(in[0])}; },
                                  {Var(x)})[0];
          return sum(mul(y, Var(x)));
        },
        {block.gate->weight, block.proj->weight}, GradcheckOptions{});
    if (!gr.ok) return failed("the recomputed feed-forward: " + gr.message);

    // 3. Train it through the library's Trainer, selected by name in a config.
    const fs::path dir = fs::temp_directory_path() / ("tapeformer-custom-layer-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    {
      std::ofstream text(dir / "text.txt");
      for (int i = 0; i < 400; ++i) text << "the quick brown fox jumps over the lazy dog " << i % 7 << "\n";
    }
    TrainConfig tc = TrainConfig::parse(R"({
      "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "block": "swiglu"},
      "train": {"batch_size": 8, "max_iters": 150, "seed": 3},
      "optimizer": {"lr": 0.003},
      "schedule": {"warmup_iters": 10, "decay_iters": 150},
      "eval": {"interval": 50, "iters": 4, "final_iters": 8},
      "log": {"interval": 50}})", "custom_layer");
    tc.data.path = (dir / "text.txt").string();
    Trainer trainer(tc, (dir / "run").string());
    const TrainResult r = trainer.run();
    // Again with every block recomputed in the backward (its stack does it for any layer kind).
    tc.train.recompute = "blocks";
    Trainer again(tc, (dir / "recomputed").string());
    const TrainResult rr = again.run();
    fs::remove_all(dir);
    if (rr.train_loss != r.train_loss || rr.val_loss != r.val_loss)
      return failed("train.recompute=blocks changed the run: train loss " + std::to_string(rr.train_loss) + " against " +
                    std::to_string(r.train_loss));
    std::printf("custom_layer: silu_gate gradchecks (%lld elements), SwiGLU block trained: %s\n",
                static_cast<long long>(g.checked), r.to_json().c_str());
    // Uniform over the ~25 characters is ln 25 = 3.2 nats; the text is very regular.
    if (!(r.val_loss < 1.5)) return failed("training did not learn (val loss " + std::to_string(r.val_loss) + ")");
    return 0;
  } catch (const std::exception& e) {
    return failed(e.what());
  }
}
