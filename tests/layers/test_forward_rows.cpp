// Reading piece by piece when only some positions need an output (early
// exit, ACT halting): Attention::forward_rows and TransformerBlock::forward_rows
// give forward(x, state)'s rows bit for bit and leave the state as forward
// would, so the next piece reads the same keys. Softmax runs its fused kernel
// on the rows from an empty cache and its keys-and-values-only projection for
// no rows; a kind without its own (linear attention) picks forward's rows.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "kind_tests.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/core/error.h"
#include "tapeformer/layers/block/standard.h"

using namespace tapeformer;
using namespace kind_tests;

namespace {

ModelConfig rows_config(const std::string& attention, const std::string& positional, bool bias = true,
                        int64_t width = 24) {
  ModelConfig c;
  c.vocab_size = 11;
  c.block_size = 64;
  c.n_layer = 2;
  c.n_head = width / 8;
  c.n_embd = width;
  c.bias = bias;
  c.attention = attention;
  c.positional = positional;
  c.validate_kinds();
  return c;
}

// Bits that differ between a and b (same shape).
int64_t differing(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<Scalar> x = a.contiguous().to_vector(), y = b.contiguous().to_vector();
  int64_t n = 0;
  for (size_t i = 0; i < x.size(); ++i) n += x[i] != y[i];
  return n;
}

// Row subsets of B * T positions: all, none, every other one, the last of each sequence.
std::vector<std::vector<int64_t>> subsets(int64_t B, int64_t T) {
  std::vector<std::vector<int64_t>> s(4);
  for (int64_t i = 0; i < B * T; ++i) {
    s[0].push_back(i);
    if (i % 2 == 0) s[2].push_back(i);
    if (i % T == T - 1) s[3].push_back(i);
  }
  return s;
}

}  // namespace

TEST_CASE("forward_rows: an attention layer's rows equal forward(x, state)'s bit for bit, and so does the next piece") {
  const std::vector<std::pair<std::string, std::string>> kinds = {
      {"softmax", "learned"}, {"softmax", "rope"}, {"softmax", "alibi"}, {"linear", "learned"}};
  for (const auto& [attention, positional] : kinds) {
    for (const bool bias : {true, false}) {
      CAPTURE(attention);
      CAPTURE(positional);
      CAPTURE(bias);
      const ModelConfig cfg = rows_config(attention, positional, bias);
      Rng rng(4);
      const auto pos = positional_kinds().get(cfg.positional).make(cfg, rng);
      const std::shared_ptr<Attention> attn = make_attention(cfg, pos->make_layer(rng), rng);
      attn->eval();
      NoGradGuard no_grad;
      const int64_t B = 2;
      // From an empty state (softmax: the fused kernel), then after cached positions (the offset path).
      for (const int64_t T : {20, 3}) {
        CAPTURE(T);
        const Tensor prompt = normal({B, 5, 24}, 7), x = normal({B, T, 24}, 8), next = normal({B, 2, 24}, 9);
        const auto full_state = attn->make_state(B, -1);
        if (T == 3) attn->forward(Var(prompt), *full_state);
        const Tensor full = attn->forward(Var(x), *full_state).value();                  // (B, T, C)
        const Tensor full_next = attn->forward(Var(next), *full_state).value();
        for (const auto& rows : subsets(B, T)) {
          CAPTURE(rows.size());
          const auto state = attn->make_state(B, -1);
          if (T == 3) attn->forward(Var(prompt), *state);
          const Tensor got = attn->forward_rows(Var(x), *state, rows).value();  // (1, R, C)
          CHECK(state->length() == full_state->length() - 2);
          CHECK(differing(got, pick_rows(Var(full), rows).value()) == 0);
          CHECK(differing(attn->forward(Var(next), *state).value(), full_next) == 0);
        }
      }
    }
  }
}

TEST_CASE("forward_rows: a block's rows get forward(x, state)'s values, the others keep x; refusals name the row") {
  // Widths of 24 (rows of 96 bytes: normalised where x puts them) and 32 (128 bytes: gathered first).
  for (const auto& [positional, C] : std::vector<std::pair<std::string, int64_t>>{{"learned", 24}, {"rope", 24},
                                                                                  {"learned", 32}}) {
    CAPTURE(positional);
    CAPTURE(C);
    const ModelConfig cfg = rows_config("softmax", positional, true, C);
    Rng rng(6);
    const auto pos = positional_kinds().get(cfg.positional).make(cfg, rng);
    TransformerBlock block(cfg, *pos, rng);
    block.eval();
    NoGradGuard no_grad;
    const int64_t B = 2, T = 17;
    const Tensor x = normal({B, T, C}, 10), next = normal({B, 1, C}, 11);
    const auto full_state = block.make_state(B, -1);
    const Tensor full = block.forward(Var(x), *full_state).value();
    const Tensor full_next = block.forward(Var(next), *full_state).value();
    for (const auto& rows : subsets(B, T)) {
      CAPTURE(rows.size());
      const auto state = block.make_state(B, -1);
      const Tensor got = block.forward_rows(Var(x), *state, rows).value();  // (B, T, C)
      std::vector<bool> chosen(static_cast<size_t>(B * T), false);
      for (const int64_t r : rows) chosen[static_cast<size_t>(r)] = true;
      int64_t wrong = 0;
      for (int64_t i = 0; i < B * T; ++i)
        for (int64_t c = 0; c < C; ++c) {
          const Scalar want = chosen[static_cast<size_t>(i)] ? full.data()[i * C + c] : x.data()[i * C + c];
          wrong += got.data()[i * C + c] != want;
        }
      CHECK(wrong == 0);
      CHECK(differing(block.forward(Var(next), *state).value(), full_next) == 0);
    }
    const auto state = block.make_state(B, -1);
    CHECK_THROWS_WITH_AS(block.forward_rows(Var(x), *state, {3, 1}), doctest::Contains("out of range or out of order"),
                         Error);
    CHECK_THROWS_WITH_AS(pick_rows(Var(x), {B * T}), doctest::Contains("row 34 of 34 is out of range"), Error);
  }
}
