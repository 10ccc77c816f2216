// The table of attention kinds, and what every kind shares: the Attention
// base, the head merge and the refusal of positional pair terms.
#include "tapeformer/layers/attention/attention.h"

#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/layers/attention/sparse.h"

namespace tapeformer {

// Each kind's entry, defined in its own file.
AttentionKind softmax_attention_kind();  // softmax.cpp
AttentionKind linear_attention_kind();   // linear.cpp
AttentionKind linformer_attention_kind();  // linformer.cpp
AttentionKind adaptive_span_attention_kind();  // adaptive_span.cpp
AttentionKind lsh_attention_kind();            // lsh.cpp
AttentionKind distance_aware_attention_kind();  // distance_aware.cpp
AttentionKind rfa_attention_kind();             // rfa.cpp
AttentionKind sinkhorn_attention_kind();        // sinkhorn.cpp
AttentionKind routing_attention_kind();         // routing.cpp
AttentionKind etc_attention_kind();             // etc.cpp

Registry<AttentionKind>& attention_kinds() {
  static Registry<AttentionKind> kinds = [] {
    Registry<AttentionKind> r("model.attention",
                              {softmax_attention_kind(), linear_attention_kind(), linformer_attention_kind(),
                               adaptive_span_attention_kind(), lsh_attention_kind(),
                               distance_aware_attention_kind(), rfa_attention_kind(), sinkhorn_attention_kind(),
                               routing_attention_kind(), etc_attention_kind()});
    for (const SparsePatternKind& p : sparse_pattern_kinds().kinds()) r.add(sparse_attention_kind(p));  // sparse.h
    return r;
  }();
  return kinds;
}

std::shared_ptr<Attention> make_attention(const ModelConfig& cfg, std::shared_ptr<PositionalLayer> pos, Rng& rng) {
  const AttentionKind& kind = attention_kinds().get(cfg.attention);
  std::shared_ptr<Attention> attn = kind.make(cfg, std::move(pos), rng);
  TAPEFORMER_CHECK(attn != nullptr, "model.attention \"", kind.name, "\": its make returned no layer");
  const double counted = kind.parameters(cfg);
  const double built = static_cast<double>(attn->num_parameters() - attn->positional().num_parameters());
  TAPEFORMER_CHECK(counted == built, "model.attention \"", kind.name, "\": its entry counts ", counted,
                   " parameters per layer (AttentionKind::parameters, the positional part excluded) but the layer "
                   "it builds has ", built);
  return attn;
}

const char* causality_name(Causality c) {
  switch (c) {
    case Causality::strict: return "strictly causal";
    case Causality::chunk_dependent: return "causal, chunk-dependent";
    case Causality::bidirectional: return "bidirectional";
    case Causality::either: return "causal or bidirectional";
  }
  return "?";
}

bool serves(Causality c, bool causal) {
  if (c == Causality::either) return true;
  return causal ? c != Causality::bidirectional : c == Causality::bidirectional;
}

Attention::Attention(std::shared_ptr<PositionalLayer> pos) : pos_(std::move(pos)) {
  TAPEFORMER_CHECK(pos_ != nullptr, "Attention: the positional layer is null");
  register_module("pos", pos_);
}

Attention::Attention(std::shared_ptr<PositionalLayer> pos, Wraps) : pos_(std::move(pos)) {
  TAPEFORMER_CHECK(pos_ != nullptr, "Attention: the positional layer is null");
}

void Attention::check_inference(const char* who, const Var& x, int64_t n_embd) const {
  TAPEFORMER_CHECK(!grad_enabled() && !is_training(), who,
                   ": the inference-state forward is for inference (eval() and NoGradGuard)");
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, who, ": input ", x.shape(), " must be (B, T, ", n_embd, ")");
}

Var Attention::forward_rows(const Var& x, InferenceState& state, const std::vector<int64_t>& rows) const {
  TAPEFORMER_CHECK(x.rank() == 3, "Attention::forward_rows: x must be (B, T, C), got ", x.shape());
  check_rows(rows, x.dim(0) * x.dim(1), "Attention::forward_rows");  // before the state takes x in
  return pick_rows(forward(x, state), rows);
}

void check_rows(const std::vector<int64_t>& rows, int64_t N, const char* who) {
  for (size_t i = 0; i < rows.size(); ++i)
    TAPEFORMER_CHECK(rows[i] >= 0 && rows[i] < N && (i == 0 || rows[i] > rows[i - 1]), who, ": row ", rows[i], " of ",
                     N, " is out of range or out of order (rows ascend)");
}

Var pick_rows(const Var& x, const std::vector<int64_t>& rows) {
  TAPEFORMER_CHECK(x.rank() == 3, "pick_rows: x must be (B, T, C), got ", x.shape());
  const int64_t N = x.dim(0) * x.dim(1);
  check_rows(rows, N, "pick_rows");
  std::vector<int32_t> index(rows.begin(), rows.end());
  if (index.empty()) return Var(Tensor::zeros({1, 0, x.dim(2)}));
  const Var flat = reshape(contiguous(x), {1, N, x.dim(2)});  // (1, B T, C)
  if (index.size() == static_cast<size_t>(N)) return flat;  // every row, in order (rows ascend)
  const auto R = static_cast<int64_t>(index.size());
  return gather_rows(flat, IndexTensor({R}, std::move(index)));  // (1, R, C)
}

Var Attention::forward(const Var& x, const Var& memory, Rng& rng) const {
  if (!memory.defined() || memory.dim(1) == 0) return forward(x, rng);
  fail("this attention kind takes no segment memory (model.mem_len needs model.attention \"softmax\")");
}


Var Attention::content_attention(const Var&, const Var&) const {
  fail("this attention kind has no content attention (model.cmem_fn \"conv\" needs model.attention \"softmax\")");
}

Var merge_heads(const Var& y) {
  return reshape(permute(y, {0, 2, 1, 3}), {y.dim(0), y.dim(2), y.dim(1) * y.dim(3)});  // (B, T, H * D)
}

void refuse_pair_terms(const PositionalKind& pos, PairTerms refused, const std::string& kind, const char* why) {
  const PositionalNeeds& n = pos.needs;
  const bool has = n.relative_terms || (refused != PairTerms::learned && n.score_bias) ||
                   (refused == PairTerms::scores_and_rotations && n.rotates_qk);
  TAPEFORMER_CHECK(!has, "model.positional \"", pos.name, "\" does not combine with model.attention \"", kind, "\": ",
                   why);
}

}  // namespace tapeformer
