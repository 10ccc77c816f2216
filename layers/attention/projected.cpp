#include "tapeformer/layers/attention/projected.h"

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/softmax.h"

namespace tapeformer {

ProjectedAttention::ProjectedAttention(const char* who, std::shared_ptr<PositionalLayer> pos, int64_t n_embd_,
                                       int64_t n_head_, float dropout)
    : Attention(std::move(pos)), n_embd(n_embd_), n_head(n_head_), dropout_p(dropout), who_(who) {
  TAPEFORMER_CHECK(n_head > 0 && n_embd % n_head == 0, who, ": n_embd ", n_embd, " is not divisible by n_head ",
                   n_head);
}

double ProjectedAttention::projection_parameters(const ModelConfig& cfg, Projection p) {
  const double C = static_cast<double>(cfg.n_embd), m = p == Projection::qkv ? 4 : 3;
  return m * C * C + (cfg.bias ? m * C : 0);  // qkv [C, 3C] (or [C, 2C]) and proj [C, C]
}

void ProjectedAttention::init_projections(bool bias, float proj_init_std, Rng& rng, Projection p) {
  projection_ = p;
  const int64_t width = (p == Projection::qkv ? 3 : 2) * n_embd;
  qkv = register_module("qkv", std::make_shared<Linear>(n_embd, width, bias, rng));
  proj = register_module("proj", std::make_shared<Linear>(n_embd, n_embd, bias, rng, proj_init_std));
  resid_drop = register_module("resid_drop", std::make_shared<Dropout>(dropout_p));
}

std::vector<Var> ProjectedAttention::heads_of(const Var& projected) const {
  if (projection_ == Projection::qkv) return split_heads(projected, n_head);  // q, k, v (B, H, T, D)
  // Shared-QK: the packed [q | v] projection split as two heads-of-two.
  const Var& qv = projected;  // (B, T, 2C)
  const int64_t B = qv.dim(0), T = qv.dim(1), D = n_embd / n_head;
  const auto head_view = [&](int64_t c0) {  // columns c0..c0+C as (B, H, T, D)
    return permute(reshape(slice(qv, 2, c0, c0 + n_embd), {B, T, n_head, D}), {0, 2, 1, 3});
  };
  const Var q = head_view(0);
  return {q, q, head_view(n_embd)};
}

Var ProjectedAttention::output(const Var& y, Rng& rng) const {
  return resid_drop->forward(proj->forward(merge_heads(y)), rng);  // (B, T, C)
}

Var ProjectedAttention::output(const Var& y) const { return proj->forward(merge_heads(y)); }

ProjectedAttention::Attended ProjectedAttention::attend_with_heads(const Var&, const Var&, Rng&) const {
  fail(who_, ": this attention kind does not give its heads to a wrapper (the Memorizing Transformer's external "
       "memory needs model.attention \"softmax\")");
}

Var ProjectedAttention::inner_attention(const Var&, const Var&, const Var&, int64_t, int64_t, float, Rng*) const {
  fail(who_, ": the kind overrides neither ProjectedAttention's forwards nor inner_attention()");
}

Var ProjectedAttention::forward(const Var& x, Rng& rng) const {
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, who_, ": input ", x.shape(), " must be (B, T, ", n_embd, ")");
  const std::vector<Var> h = heads(x);  // q, k, v (B, H, T, D)
  const PositionalLayer& pos = positional();
  return output(inner_attention(pos.rotate(h[0], 0), pos.rotate(h[1], 0), h[2], 0, 0, live_dropout(), &rng), rng);
}

std::unique_ptr<InferenceState> ProjectedAttention::make_state(int64_t batch, int64_t window) const {
  return std::make_unique<KVCache>(batch, n_head, n_embd / n_head, window);
}

Var ProjectedAttention::forward(const Var& x, InferenceState& state) const {
  check_inference(x);
  KVCache& cache = state_as<KVCache>(state, who_, "KVCache");
  const int64_t q0 = cache.length();
  const std::vector<Var> h = heads(x);  // (B, H, T, D)
  const PositionalLayer& pos = positional();
  const KVCache::Window w = cache.append(pos.rotate(h[1], q0).value(), h[2].value());  // (B, H, held, D)
  return output(inner_attention(pos.rotate(h[0], q0), Var(w.k), Var(w.v), q0, w.start, 0.0f, nullptr));  // (B, T, C)
}

}  // namespace tapeformer
