#include "layers/attention.h"

#include <array>
#include <cmath>

#include "core/error.h"

namespace tapeformer {
namespace {

// [Tq, Tk] with 1 where key j is in the future of query i (j > i + Tk - Tq).
Tensor causal_mask(int64_t Tq, int64_t Tk) {
  Tensor m = Tensor::zeros({Tq, Tk});
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = i + (Tk - Tq) + 1; j < Tk; ++j) m.at({i, j}) = 1.0f;
  return m;
}

// qkv (B, T, 3C) -> (B, T, 3, H, D) -> (3, B, H, T, D): q, k, v (B, H, T, D)
// each, as strided views where the layout allows.
std::array<Var, 3> split_heads(const Var& qkv, int64_t n_head) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, H = n_head, D = C / n_head;
  const Var heads = permute(reshape(qkv, {B, T, 3, H, D}), {2, 0, 3, 1, 4});
  const auto part = [&](int64_t i) { return reshape(slice(heads, 0, i, i + 1), {B, H, T, D}); };
  return {part(0), part(1), part(2)};
}

// y (B, H, T, D) -> (B, T, C), heads side by side.
Var merge_heads(const Var& y) {
  return reshape(permute(y, {0, 2, 1, 3}), {y.dim(0), y.dim(2), y.dim(1) * y.dim(3)});
}

}  // namespace

Var scaled_dot_product_attention(const Var& q, const Var& k, const Var& v, bool causal,
                                 float dropout_p, Rng* rng) {
  TAPEFORMER_CHECK(q.rank() == 4 && k.rank() == 4 && v.rank() == 4,
                   "attention: q, k, v must be (B, H, T, D), got ", q.shape(), ", ", k.shape(), ", ",
                   v.shape());
  TAPEFORMER_CHECK(k.shape() == v.shape() && q.dim(3) == k.dim(3) && q.dim(0) == k.dim(0) &&
                       q.dim(1) == k.dim(1),
                   "attention: incompatible q ", q.shape(), ", k ", k.shape(), ", v ", v.shape());
  const int64_t Tq = q.dim(2), Tk = k.dim(2), D = q.dim(3);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Var scores = mul_scalar(matmul(q, transpose(k, 2, 3)), scale);  // (B, H, Tq, Tk)
  // -inf, not a large negative number: masked probabilities are exactly 0.
  if (causal) scores = masked_fill(scores, causal_mask(Tq, Tk), -INFINITY);
  Var att = softmax(scores);  // (B, H, Tq, Tk)
  if (dropout_p > 0.0f) {
    TAPEFORMER_CHECK(rng != nullptr, "attention: dropout needs an Rng");
    att = dropout(att, dropout_p, *rng);
  }
  return matmul(att, v);  // (B, H, Tq, D)
}

Var composed_attention(const Var& qkv, int64_t n_head, bool causal, float dropout_p, Rng* rng) {
  TAPEFORMER_CHECK(qkv.rank() == 3 && qkv.dim(2) % (3 * n_head) == 0, "composed_attention: qkv ", qkv.shape(),
                   " must be (B, T, 3C) with C divisible by n_head ", n_head);
  const auto [q, k, v] = split_heads(qkv, n_head);  // (B, H, T, D) each
  return merge_heads(scaled_dot_product_attention(q, k, v, causal, dropout_p, rng));  // (B, T, C)
}

namespace {
Shape cache_shape(int64_t batch, int64_t n_head, int64_t head_dim, int64_t capacity) {
  TAPEFORMER_CHECK(batch > 0 && n_head > 0 && head_dim > 0 && capacity > 0, "KVCache: batch ", batch, ", heads ",
                   n_head, ", head dim ", head_dim, " and capacity ", capacity, " must all be >= 1");
  return {batch, n_head, capacity, head_dim};  // (B, H, capacity, D)
}
}  // namespace

KVCache::KVCache(int64_t batch, int64_t n_head, int64_t head_dim, int64_t capacity)
    : k_(Tensor::zeros(cache_shape(batch, n_head, head_dim, capacity))), v_(Tensor::zeros(k_.shape())) {}

std::pair<Tensor, Tensor> KVCache::append(const Tensor& k, const Tensor& v) {
  TAPEFORMER_CHECK(k.rank() == 4 && k.shape() == v.shape() && k.dim(0) == k_.dim(0) && k.dim(1) == k_.dim(1) &&
                       k.dim(3) == k_.dim(3),
                   "KVCache: k ", k.shape(), " and v ", v.shape(), " must both be (", k_.dim(0), ", ", k_.dim(1),
                   ", T, ", k_.dim(3), ")");
  const int64_t T = k.dim(2);
  TAPEFORMER_CHECK(length_ + T <= capacity(), "KVCache: ", length_, " cached positions + ", T,
                   " new exceed its capacity ", capacity());
  k_.slice(2, length_, length_ + T).copy_from(k);
  v_.slice(2, length_, length_ + T).copy_from(v);
  length_ += T;
  return {k_.slice(2, 0, length_), v_.slice(2, 0, length_)};  // (B, H, M + T, D) each
}

MultiHeadAttention::MultiHeadAttention(int64_t n_embd_, int64_t n_head_, bool bias, float dropout,
                                       float proj_init_std, Rng& rng, bool causal_)
    : n_embd(n_embd_), n_head(n_head_), dropout_p(dropout), causal(causal_) {
  TAPEFORMER_CHECK(n_head > 0 && n_embd % n_head == 0, "MultiHeadAttention: n_embd ", n_embd,
                   " is not divisible by n_head ", n_head);
  qkv = register_module("qkv", std::make_shared<Linear>(n_embd, 3 * n_embd, bias, rng));
  proj = register_module("proj", std::make_shared<Linear>(n_embd, n_embd, bias, rng, proj_init_std));
  resid_drop = register_module("resid_drop", std::make_shared<Dropout>(dropout));
}

Var MultiHeadAttention::forward(const Var& x, Rng& rng) const {
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, "MultiHeadAttention: input ", x.shape(),
                   " must be (B, T, ", n_embd, ")");
  const float p = is_training() ? dropout_p : 0.0f;
  Var y = causal ? causal_attention(qkv->forward(x), n_head, p, &rng)  // fused kernel, (B, T, C)
                 : composed_attention(qkv->forward(x), n_head, false, p, &rng);
  return resid_drop->forward(proj->forward(y), rng);
}

std::unique_ptr<KVCache> MultiHeadAttention::make_cache(int64_t batch, int64_t capacity) const {
  return std::make_unique<KVCache>(batch, n_head, n_embd / n_head, capacity);
}

Var MultiHeadAttention::forward(const Var& x, KVCache& cache) const {
  TAPEFORMER_CHECK(causal, "MultiHeadAttention: a KV cache needs causal attention");
  TAPEFORMER_CHECK(!grad_enabled() && !is_training(),
                   "MultiHeadAttention: the KV-cache forward is for inference (eval() and NoGradGuard)");
  TAPEFORMER_CHECK(x.rank() == 3 && x.dim(2) == n_embd, "MultiHeadAttention: input ", x.shape(),
                   " must be (B, T, ", n_embd, ")");
  const Var qkv_x = qkv->forward(x);                          // (B, T, 3C)
  const auto [q, k_new, v_new] = split_heads(qkv_x, n_head);  // (B, H, T, D) each
  const bool first = cache.length() == 0;
  const auto [k, v] = cache.append(k_new.value(), v_new.value());  // (B, H, M + T, D) each, M cached before
  // An empty cache sees what forward(x, rng) sees: the same fused kernel,
  // so a sequence fed whole gives bit-identical outputs. New positions after
  // cached ones attend through the offset causal mask (query i sees the M
  // cached keys and new keys <= i).
  const Var y = first ? causal_attention(qkv_x, n_head)  // (B, T, C)
                      : merge_heads(scaled_dot_product_attention(q, Var(k), Var(v), true, 0.0f, nullptr));
  return proj->forward(y);  // (B, T, C)
}

}  // namespace tapeformer
