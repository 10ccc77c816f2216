// "alibi": attention with linear biases (Press et al. 2021 §3). Head h
// adds -m_h (i - j) to the scaled score of query position i and key position
// j; nothing is added to the embeddings and nothing is learned.
#include <cmath>

#include "tapeformer/core/error.h"
#include "tapeformer/layers/positional/positional.h"

namespace tapeformer {

std::vector<float> alibi_slopes(int64_t n_head) {
  TAPEFORMER_CHECK(n_head >= 1, "alibi_slopes: n_head must be >= 1, got ", n_head);
  // 2^(-8 h / n), h = 1..n, for n a power of two.
  const auto power_of_two = [](int64_t n) {
    std::vector<float> s(static_cast<size_t>(n));
    for (int64_t h = 1; h <= n; ++h) s[static_cast<size_t>(h - 1)] = static_cast<float>(std::exp2(-8.0 * h / n));
    return s;
  };
  int64_t n = 1;
  while (2 * n <= n_head) n *= 2;
  std::vector<float> slopes = power_of_two(n);
  const std::vector<float> twice = power_of_two(2 * n);
  for (size_t i = 0; static_cast<int64_t>(slopes.size()) < n_head; i += 2) slopes.push_back(twice[i]);
  return slopes;
}

namespace {

constexpr PositionalNeeds kAlibiNeeds{/*rotates_qk=*/false, /*score_bias=*/true, /*relative_terms=*/false};

class AlibiLayer : public PositionalLayer {
 public:
  explicit AlibiLayer(int64_t n_head) : PositionalLayer(kAlibiNeeds), slopes_(alibi_slopes(n_head)) {}

  // -m_h (q0 + i - k0 - j) as a row term -m_h (q0 + i - k0) (1, H, Tq, 1) and a
  // column term m_h j (1, H, 1, Tk): O(T) memory, and relative to the first key
  // so the terms stay small whatever the absolute positions.
  std::vector<Tensor> score_bias(int64_t n_head, int64_t Tq, int64_t Tk, int64_t q0, int64_t k0) const override {
    TAPEFORMER_CHECK(n_head == static_cast<int64_t>(slopes_.size()), "alibi: made for ", slopes_.size(),
                     " heads, asked for ", n_head);
    Tensor row = Tensor::empty({1, n_head, Tq, 1}), col = Tensor::empty({1, n_head, 1, Tk});
    for (int64_t h = 0; h < n_head; ++h) {
      const float m = slopes_[static_cast<size_t>(h)];
      for (int64_t i = 0; i < Tq; ++i) row.data()[h * Tq + i] = -m * static_cast<float>(q0 + i - k0);
      for (int64_t j = 0; j < Tk; ++j) col.data()[h * Tk + j] = m * static_cast<float>(j);
    }
    return {row, col};
  }

 private:
  std::vector<float> slopes_;
};

class AlibiPositional : public Positional {
 public:
  explicit AlibiPositional(int64_t n_head) : n_head_(n_head) {}
  std::shared_ptr<PositionalLayer> make_layer(Rng&) const override { return std::make_shared<AlibiLayer>(n_head_); }

 private:
  int64_t n_head_;
};

}  // namespace

PositionalKind alibi_positional_kind() {
  PositionalKind kind;
  kind.name = "alibi";
  kind.summary = "ALiBi (Press et al. 2021): a per-head linear penalty on the query-key distance, added to the scores (any "
                 "length; not with linear attention, which has no scores)";
  kind.needs = kAlibiNeeds;
  kind.make = [](const ModelConfig& cfg, Rng&) { return std::make_shared<AlibiPositional>(cfg.n_head); };
  kind.parameters = [](const ModelConfig&) { return 0.0; };
  kind.check = [](const ModelConfig&) {};
  return kind;
}

}  // namespace tapeformer
