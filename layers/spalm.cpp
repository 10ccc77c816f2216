#include "tapeformer/layers/spalm.h"

#include <limits>
#include <utility>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"

namespace tapeformer {

Var spalm_mix(const Var& h, const IndexTensor& retrieved, const Var& table, const Var& gate_weight,
              const Var& gate_bias) {
  TAPEFORMER_CHECK(h.defined() && table.defined() && gate_weight.defined() && gate_bias.defined(),
                   "spalm_mix: undefined input");
  const Shape& hs = h.shape();
  TAPEFORMER_CHECK(hs.rank() == 3, "spalm_mix: h must be (B, T, C), got ", hs);
  const int64_t B = hs[0], T = hs[1], C = hs[2];
  TAPEFORMER_CHECK(retrieved.shape.rank() == 3 && retrieved.shape[0] == B && retrieved.shape[1] == T &&
                       retrieved.shape[2] >= 1,
                   "spalm_mix: retrieved must be (B, T, K) = (", B, ", ", T, ", K >= 1) for h ", hs, ", got ",
                   retrieved.shape);
  TAPEFORMER_CHECK(table.shape().rank() == 2 && table.shape()[1] == C, "spalm_mix: embedding must be [V, ",
                   C, "] for h ", hs, ", got ", table.shape());
  TAPEFORMER_CHECK(gate_weight.shape() == Shape({C, 1}) && gate_bias.shape() == Shape({1}),
                   "spalm_mix: the gate must be weight [", C, ", 1] and bias [1], got ", gate_weight.shape(), " and ",
                   gate_bias.shape());
  const int64_t K = retrieved.shape[2], V = table.shape()[0], BT = B * T;

  // Ids of -1 become row 0 of E, masked out of the softmax below; a position
  // with no id at all keeps h (its gate is forced to 1), so its softmax is
  // left unmasked (finite) and its m, though computed, is multiplied by 0.
  IndexTensor ids = retrieved;
  Tensor missing = Tensor::zeros({BT, K}), none = Tensor::zeros({B, T, 1});
  for (int64_t r = 0; r < BT; ++r) {
    int64_t found = 0;
    for (int64_t k = 0; k < K; ++k) {
      int32_t& id = ids.data[static_cast<size_t>(r * K + k)];
      TAPEFORMER_CHECK(id >= -1 && id < V, "spalm_mix: retrieved token ", id, " at (", r / T, ", ", r % T, ", ", k,
                       ") is outside [-1, ", V, ") (embedding ", table.shape(), ")");
      if (id < 0) {
        id = 0;
        missing.data()[r * K + k] = 1.0f;
      } else {
        ++found;
      }
    }
    if (found == 0) {
      for (int64_t k = 0; k < K; ++k) missing.data()[r * K + k] = 0.0f;
      none.data()[r] = 1.0f;
    }
  }

  const Var e = reshape(embedding(table, ids), {BT, K, C});                   // (BT, K, C): e_k = E[y_k]
  const Var scores = reshape(matmul(e, reshape(h, {BT, C, 1})), {BT, K});           // (BT, K): e_k . h_t
  const Var a = softmax(masked_fill(scores, missing, -std::numeric_limits<Scalar>::infinity()));  // (BT, K)
  const Var m = reshape(matmul(reshape(a, {BT, 1, K}), e), {B, T, C});              // (B, T, C)
  const Var g = where(none, Var(Tensor::ones({1})), sigmoid(linear(h, gate_weight, gate_bias)));  // (B, T, 1)
  // g h + (1 - g) m: with g exactly 1 this is h + 0 = h bit for bit.
  return add(mul(g, h), mul(add_scalar(neg(g), 1.0f), m));  // (B, T, C)
}

namespace {

int64_t spalm_k(const ModelConfig& cfg) {
  const int64_t k = cfg.option_int("spalm_k");
  TAPEFORMER_CHECK(k >= 1 && k <= 4096, "model.spalm_k must be in [1, 4096], got ", k);
  return k;
}

}  // namespace

SpalmLM::SpalmLM(const ModelConfig& cfg, Rng& rng) : k_(spalm_k(cfg)) {
  TAPEFORMER_CHECK(cfg.option_int("mem_len") > 0, "model.arch \"spalm\" is a Transformer-XL with a long-term memory: "
                   "set model.mem_len > 0 (its short-term memory)");
  lm = register_inline(std::make_shared<TransformerLM>(cfg, rng));
  gate = register_module("spalm_gate", std::make_shared<Linear>(cfg.n_embd, 1, true, rng));
  gate->weight.value().copy_from(Tensor::zeros({cfg.n_embd, 1}));
  gate->bias.value().copy_from(Tensor::full({1}, static_cast<Scalar>(cfg.option_number("spalm_gate_bias"))));
}

ModelFootprint SpalmLM::footprint(const ModelConfig& cfg) {
  ModelFootprint f = TransformerLM::footprint(cfg);
  f.parameters += static_cast<double>(cfg.n_embd) + 1;  // the gate w_g, b_g
  return f;
}

Var SpalmLM::forward(const IndexTensor& ids, const ModelContext& ctx) const {
  const auto it = ctx.inputs != nullptr ? ctx.inputs->find(kRetrieved) : ModelInputs::const_iterator();
  TAPEFORMER_CHECK(ctx.inputs != nullptr && it != ctx.inputs->end(), "model.arch \"spalm\" reads model.spalm_k = ",
                   k_, " retrieved tokens at every position (ModelContext::inputs[\"", kRetrieved,
                   "\"]), which its hooks give train, eval and sample (model.spalm_store, "
                   "model.spalm_retriever)");
  const IndexTensor& retrieved = it->second;
  TAPEFORMER_CHECK(retrieved.shape.rank() == 3 && retrieved.shape[2] == k_, "SpalmLM: retrieved must be (B, T, ",
                   k_, ") (model.spalm_k = ", k_, "), got ", retrieved.shape);
  ModelContext xl = ctx;  // the XL reads the ids alone, and returns what its head would read
  xl.inputs = nullptr;
  xl.features = true;
  const Var z = spalm_mix(lm->forward(ids, xl), retrieved, lm->tok_emb->weight, gate->weight, gate->bias);  // (B, T, C)
  return ctx.features ? z : lm->logits_from_features(z);
}

std::unique_ptr<InferenceState> SpalmLM::make_state(int64_t batch, int64_t window) const {
  return lm->make_state(batch, window);
}

ModelKind spalm_model_kind() {
  ModelKind kind;
  kind.name = "spalm";
  kind.summary = "SPALM (Yogatama et al. 2021): a Transformer-XL whose output attends over K tokens retrieved from a "
                 "kNN store, mixed in by a learned gate";
  kind.options = {
      {"spalm_k", int64_t{16}, "SPALM: K, the tokens retrieved from the long-term memory at every position",
       OptionValue{int64_t{3}}},
      {"spalm_gate_bias", 0.0,
       "SPALM: the gate's initial bias b_g; g = sigmoid(w_g . h + b_g) weighs the XL's h against the retrieved "
       "tokens' m (w_g starts at 0)"},
      {"spalm_store", std::string(),
       "SPALM: the kNN store (tapeformer knn build) of model.spalm_retriever whose neighbours' next tokens are "
       "retrieved"},
      {"spalm_retriever", std::string(),
       "SPALM: the checkpoint of the frozen model the store was built from; it computes the search queries"},
      {"spalm_nprobe", int64_t{0}, "SPALM: ivf cells scanned per search (0: as the store was built)"},
      {"spalm_init", true,
       "SPALM: a fresh run starts from the retriever's weights (its model.* must match but for model.arch and "
       "model.spalm_*); false: from scratch"}};
  kind.make = [](const ModelConfig& cfg, Rng& rng) -> std::unique_ptr<LanguageModel> {
    return std::make_unique<SpalmLM>(cfg, rng);
  };
  kind.footprint = SpalmLM::footprint;
  kind.small_config = [](ModelConfig& c) {  // a Transformer-XL
    c.positional = "txl";
    c.options["mem_len"] = int64_t{16};
  };
  kind.example_inputs = [](const ModelConfig& cfg, int64_t B, int64_t T) {
    const int64_t K = spalm_k(cfg);
    std::vector<int32_t> ids(static_cast<size_t>(B * T * K));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7 + 3) % static_cast<size_t>(cfg.vocab_size));
    return ModelInputs{{SpalmLM::kRetrieved, IndexTensor({B, T, K}, ids)}};
  };
  return kind;
}

}  // namespace tapeformer
