// softmax_attention with a block mask (the lean kernel restricted to a tile pattern) and
// the sparse patterns (layers/attention/sparse.h): each pattern equals dense
// softmax attention with the same mask as an additive -inf bias, values and
// gradients; the tiles and pairs are what the pattern says; tiles a pattern
// does not list are never read.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tapeformer/autograd/ops.h"
#include "tapeformer/core/error.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/core/rng.h"
#include "golden.h"
#include "op_runs.h"
#include "tapeformer/layers/attention/sparse.h"
#include "attention_calls.h"

using namespace tapeformer;
using namespace attention_calls;

namespace {

constexpr Scalar kInf = std::numeric_limits<Scalar>::infinity();

ModelConfig with(std::vector<std::pair<std::string, int64_t>> options) {
  ModelConfig c;
  for (const auto& [k, v] : options) c.options[k] = v;
  return c;
}

struct PatternCase {
  std::string kind;
  ModelConfig cfg;
};

std::vector<PatternCase> cases() {
  return {{"window", with({{"window", 37}})},
          {"fixed", with({{"sparse_block", 50}, {"summary", 7}})},
          {"longformer", with({{"window", 20}, {"dilation", 3}, {"global_tokens", 5}})},
          {"bigbird", with({{"window", 16}, {"global_tokens", 3}, {"random_blocks", 2}, {"sparse_block", 32},
                            {"sparse_seed", 4}})}};
}

// The pattern as a (1, 1, Tq, Tk) bias: 0 where query q0 + i sees key k0 + j, else -inf.
Tensor mask_bias(const SparsePattern& p, int64_t Tq, int64_t Tk, int64_t q0, int64_t k0, int64_t* pairs) {
  std::vector<Scalar> b(static_cast<size_t>(Tq * Tk));
  *pairs = 0;
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = 0; j < Tk; ++j) {
      const bool sees = p.sees(q0 + i, k0 + j);
      b[static_cast<size_t>(i * Tk + j)] = sees ? 0.0f : -kInf;
      *pairs += sees;
    }
  return Tensor::from({1, 1, Tq, Tk}, b);
}

}  // namespace

TEST_CASE("every sparse pattern equals dense softmax attention with its mask as a -inf bias (values, gradients)") {
  for (const PatternCase& pc : cases()) {
    const auto pattern = sparse_pattern_kinds().get(pc.kind).make(pc.cfg);
    // A whole sequence, and the last 70 queries over 200 keys (a KV cache's shape).
    for (const auto& [Tq, Tk] : {std::pair<int64_t, int64_t>{200, 200}, {70, 200}}) {
      const int64_t q0 = Tk - Tq;
      CAPTURE(pc.kind);
      CAPTURE(Tq);
      int64_t pairs = 0;
      const Tensor mask = mask_bias(*pattern, Tq, Tk, q0, 0, &pairs);
      const auto tiles = tile_pattern(*pattern, Tq, Tk, q0, 0);
      CHECK(tiles->pairs == pairs);  // the tiles list exactly the pattern's pairs
      CHECK(pairs < Tq * (q0 + (Tq + 1) / 2.0));  // fewer than causal dense
      Rng rng(7);
      const int64_t B = 2, H = 2, D = 8;
      const Tensor q = random({B, H, Tq, D}, rng), k = random({B, H, Tk, D}, rng), v = random({B, H, Tk, D}, rng);
      const Tensor R = random({B, H, Tq, D}, rng);
      const Tensor alibi = Tensor::from({1, 2, 1, 1}, {-0.25f, 0.5f});  // an extra score term beside the mask
      for (const Scalar p : {0.0f, 0.2f}) {
        CAPTURE(p);
        const auto sparse = [&](const std::vector<Var>& x) {
          Rng drop(3);
          return attend_blocks(x[0], x[1], x[2], tiles, {alibi}, true, p, &drop);
        };
        const auto dense = [&](const std::vector<Var>& x) {
          Rng drop(3);
          return attend(x[0], x[1], x[2], {alibi, mask}, true, p, &drop);
        };
        const Run a = run(sparse, {q, k, v}, R), b = run(dense, {q, k, v}, R);
        check_close(a.y, b.y, "value", 1e-5);
        for (size_t g = 0; g < 3; ++g) check_close(a.grads[g], b.grads[g], "gradient " + std::to_string(g), 1e-5);
      }
    }
  }
}

TEST_CASE("strided: its two head groups, the residue half as strided views of its classes, equal dense attention with per-head masks") {
  const auto strided = sparse_pattern_kinds().get("strided").make(with({{"stride", 9}}));
  const auto groups = strided->head_groups();
  REQUIRE(groups.size() == 2);
  CHECK(groups[0]->period() == 0);
  CHECK(groups[1]->period() == 9);
  // Classes of unequal length (200 = 22 * 9 + 2), equal (18), shorter than the
  // stride (5), and a KV cache's shape (the residue heads then use tiles).
  for (const auto& [Tq, Tk] : {std::pair<int64_t, int64_t>{200, 200}, {18, 18}, {5, 5}, {70, 200}}) {
    CAPTURE(Tq);
    CAPTURE(Tk);
    const int64_t q0 = Tk - Tq, B = 2, H = 4, D = 8;
    // Heads 0, 1 see the last 9 positions; heads 2, 3 every 9th back.
    std::vector<Scalar> mask(static_cast<size_t>(H * Tq * Tk));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j)
          mask[static_cast<size_t>((h * Tq + i) * Tk + j)] = groups[h < 2 ? 0 : 1]->sees(q0 + i, j) ? 0.0f : -kInf;
    const Tensor bias = Tensor::from({1, H, Tq, Tk}, mask);
    // A score term by position (ALiBi's shape), so a class reading the wrong pairs' terms shows.
    std::vector<Scalar> slopes(static_cast<size_t>(H * Tq * Tk));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j)
          slopes[static_cast<size_t>((h * Tq + i) * Tk + j)] =
              -0.05f * static_cast<Scalar>(h + 1) * static_cast<Scalar>(q0 + i - j) + 0.01f * static_cast<Scalar>(j % 7);
    const Tensor term = Tensor::from({1, H, Tq, Tk}, slopes);
    Rng rng(11);
    const Tensor q = random({B, H, Tq, D}, rng), k = random({B, H, Tk, D}, rng), v = random({B, H, Tk, D}, rng);
    const Tensor R = random({B, H, Tq, D}, rng);
    const auto tiles = [&](int64_t, const SparsePattern& p) { return tile_pattern(p, Tq, Tk, q0, 0); };
    const Run a = run([&](const std::vector<Var>& x) { return sparse_attention(*strided, x[0], x[1], x[2], {term}, q0, 0, 0, nullptr, tiles); },
                      {q, k, v}, R);
    const Run b = run([&](const std::vector<Var>& x) { return attend(x[0], x[1], x[2], {term, bias}); }, {q, k, v}, R);
    check_close(a.y, b.y, "value", 1e-5);
    for (size_t g = 0; g < 3; ++g) check_close(a.grads[g], b.grads[g], "gradient " + std::to_string(g), 1e-5);
  }
}

TEST_CASE("softmax_attention with head groups: residue classes longer than a tile equal dense attention; bits for any thread count") {
  // T = 300 with l = 2 and 3: classes of 150 and 100 rows, several 64-row tiles per class.
  for (const int64_t l : {int64_t{2}, int64_t{3}}) {
    CAPTURE(l);
    const int64_t B = 2, H = 2, T = 300, D = 8;
    std::vector<Scalar> mask(static_cast<size_t>(T * T)), term(static_cast<size_t>(H * T * T));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        mask[static_cast<size_t>(i * T + j)] = j <= i && (i - j) % l == 0 ? 0.0f : -kInf;
        for (int64_t h = 0; h < H; ++h)
          term[static_cast<size_t>((h * T + i) * T + j)] = -0.01f * static_cast<Scalar>((h + 1) * (i - j) + j % 5);
      }
    const Tensor bias = Tensor::from({1, 1, T, T}, mask), score = Tensor::from({1, H, T, T}, term);
    Rng rng(13);
    const Tensor q = random({B, H, T, D}, rng), k = random({B, H, T, D}, rng), v = random({B, H, T, D}, rng);
    const Tensor R = random({B, H, T, D}, rng);
    const Run a = run([&](const std::vector<Var>& x) {
      return attend_groups(x[0], x[1], x[2], {{0, H, nullptr, l}}, {score});
    }, {q, k, v}, R);
    const Run b = run([&](const std::vector<Var>& x) { return attend(x[0], x[1], x[2], {score, bias}); },
                      {q, k, v}, R);
    check_close(a.y, b.y, "value", 1e-5);
    for (size_t g = 0; g < 3; ++g) check_close(a.grads[g], b.grads[g], "gradient " + std::to_string(g), 1e-5);
  }
  // Window tiles on heads 0, 1 and residue classes on 2, 3, with dropout: the same bits on 1 and 2 threads.
  const int64_t B = 2, H = 4, T = 150, D = 8, l = 5;
  Rng rng(17);
  const Tensor q = random({B, H, T, D}, rng), k = random({B, H, T, D}, rng), v = random({B, H, T, D}, rng);
  const Tensor R = random({B, H, T, D}, rng);
  const auto window = tile_pattern(*sparse_pattern_kinds().get("window").make(with({{"window", 40}})), T, T, 0, 0);
  const auto grouped = [&](const std::vector<Var>& x) {
    Rng drop(21);
    return attend_groups(x[0], x[1], x[2], {{0, 2, window, 0}, {2, 4, nullptr, l}}, {}, 0.3f, &drop);
  };
  const int before = parallel::num_threads();
  parallel::set_num_threads(1);
  const Run one = run(grouped, {q, k, v}, R);
  parallel::set_num_threads(2);
  const Run two = run(grouped, {q, k, v}, R);
  parallel::set_num_threads(before);
  CHECK(one.y.to_vector() == two.y.to_vector());
  for (size_t g = 0; g < 3; ++g) CHECK(one.grads[g].to_vector() == two.grads[g].to_vector());
}

TEST_CASE("softmax_attention with head groups: each head draws its own dropout mask; bad groups are refused") {
  // Every head holds the same q, k, v: only the dropout masks can make heads differ.
  const int64_t B = 1, H = 4, T = 36, D = 4, l = 6;
  Rng rng(5);
  const Tensor one = random({B, 1, T, D}, rng);
  const Tensor x = one.expand({B, H, T, D}).contiguous();
  const auto window = tile_pattern(*sparse_pattern_kinds().get("window").make(with({{"window", l}})), T, T, 0, 0);
  Rng drop(9);
  const Var y = attend_groups(Var(x), Var(x), Var(x), {{0, 2, window, 0}, {2, 4, nullptr, l}}, {}, 0.5f, &drop);
  const auto differ = [&](int64_t h, int64_t g, int64_t t0, int64_t t1) {  // heads h and g on rows [t0, t1)
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t d = 0; d < D; ++d)
        if (y.value().at({0, h, t, d}) != y.value().at({0, g, t, d})) return true;
    return false;
  };
  CHECK(differ(0, 1, 0, T));  // the two window heads
  CHECK(differ(2, 3, 0, T));  // the two residue heads

  const Var q(x);
  CHECK_THROWS_WITH_AS(attend_groups(q, q, q, {{0, 2, window, 0}}), doctest::Contains("cover heads [0, 2) of 4"),
                       Error);
  CHECK_THROWS_WITH_AS(attend_groups(q, q, q, {{0, 2, window, 0}, {2, 6, nullptr, l}}),
                       doctest::Contains("a group is [2, 6)"), Error);
  CHECK_THROWS_WITH_AS(attend_groups(q, q, q, {{0, 2, window, 0}, {2, 4, window, -1}}),
                       doctest::Contains("the period of heads [2, 4) is -1"), Error);
  CHECK_THROWS_WITH_AS(attend_groups(q, q, q, {{0, 2, window, 0}, {2, 4, window, l}}),
                       doctest::Contains("either tiles or a period"), Error);
  const Var k(random({B, H, T + 2, D}, rng));
  CHECK_THROWS_WITH_AS(attend_groups(q, k, k, {{0, 4, nullptr, l}}), doctest::Contains("Tq == Tk"), Error);
}

TEST_CASE("sparse patterns: the pair counts and tiles the definitions give") {
  const ModelConfig w64 = with({{"window", 64}});
  const auto window = sparse_pattern_kinds().get("window").make(w64);
  const auto tiles = tile_pattern(*window, 1024, 1024, 0, 0);
  int64_t expected = 0;
  for (int64_t i = 0; i < 1024; ++i) expected += std::min<int64_t>(64, i + 1);
  CHECK(tiles->pairs == expected);
  CHECK(tiles->tiles() == 2 * 16 - 1);  // a 64-wide window spans its own tile and the one before
  CHECK(tiles->masks.size() == (2 * 16 - 1) * 64 * 64);  // ... partial in each: every tile has a 64 x 64 mask
  // Fixed, l = 128, c = 16 at T = 512: own block (causal) plus 16 summary keys of each earlier block.
  const auto fixed = sparse_pattern_kinds().get("fixed").make(with({{"sparse_block", 128}, {"summary", 16}}));
  expected = 0;
  for (int64_t i = 0; i < 512; ++i) expected += i % 128 + 1 + i / 128 * 16;
  CHECK(tile_pattern(*fixed, 512, 512, 0, 0)->pairs == expected);
  // BigBird draws min(r, block) distinct earlier blocks per query block, the same every time.
  const auto bigbird = sparse_pattern_kinds().get("bigbird").make(
      with({{"window", 1}, {"global_tokens", 0}, {"random_blocks", 3}, {"sparse_block", 64}, {"sparse_seed", 9}}));
  const auto bb = tile_pattern(*bigbird, 1024, 1024, 0, 0);
  int64_t random_tiles = 0;
  for (int64_t t = 0; t < 16; ++t) random_tiles += std::min<int64_t>(3, t);
  CHECK(bb->tiles() == 16 + random_tiles);  // the diagonal tile (window 1 = itself) and the random blocks
  CHECK(bb->pairs == 1024 + random_tiles * 64 * 64);
  CHECK(tile_pattern(*bigbird, 1024, 1024, 0, 0)->key_tile == bb->key_tile);
}

TEST_CASE("softmax_attention with a block mask never reads keys outside its tiles, and gives them no gradient") {
  const auto window = sparse_pattern_kinds().get("window").make(with({{"window", 10}}));
  const int64_t T = 300;
  const auto tiles = tile_pattern(*window, T, T, 0, 0);
  Rng rng(5);
  Tensor q = random({1, 2, T, 8}, rng), k = random({1, 2, T, 8}, rng), v = random({1, 2, T, 8}, rng);
  // Keys 0..63 are tile 0, which query tiles 2.. (queries 128.., seeing keys 119..) never list:
  // NaN there must not reach them. (Within a listed tile a masked key is still read.)
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 0; j < 64; ++j)
      for (int64_t d = 0; d < 8; ++d) k.at({0, h, j, d}) = v.at({0, h, j, d}) = std::nanf("");
  const Tensor R = random({1, 2, T, 8}, rng);
  std::vector<Var> x{Var(q, true), Var(k, true), Var(v, true)};
  TapeScope tape;
  const Var y = attend_blocks(x[0], x[1], x[2], tiles);
  backward(y, R);
  int64_t finite = 0;
  for (int64_t i = 128; i < T; ++i)
    finite += std::isfinite(y.value().at({0, 1, i, 3})) && std::isfinite(x[0].grad().at({0, 0, i, 5})) &&
              std::isfinite(x[1].grad().at({0, 1, i, 2})) && std::isfinite(x[2].grad().at({0, 0, i, 7}));
  CHECK(finite == T - 128);
  CHECK(std::isnan(y.value().at({0, 1, 70, 3})));  // tile 1 does read tile 0: the NaN is real
}

TEST_CASE("softmax_attention: a block mask for other lengths, or unfinished, is refused by name") {
  const auto window = sparse_pattern_kinds().get("window").make(with({{"window", 4}}));
  const auto tiles = tile_pattern(*window, 100, 100, 0, 0);
  Rng rng(1);
  const Var q(random({1, 1, 90, 4}, rng)), k(random({1, 1, 90, 4}, rng));
  CHECK_THROWS_WITH_AS(attend_blocks(q, k, k, tiles),
                       doctest::Contains("the block mask is for Tq 100, Tk 100 but q is [1, 1, 90, 4]"), Error);
  auto unfinished = std::make_shared<kernels::BlockMask>(90, 90);
  unfinished->add(0, nullptr);
  unfinished->end_row();
  CHECK_THROWS_WITH_AS(attend_blocks(q, k, k, unfinished), doctest::Contains("the block mask is unfinished"),
                       Error);
  kernels::BlockMask p(90, 90);
  p.add(1, nullptr);
  CHECK_THROWS_WITH_AS(p.add(0, nullptr), doctest::Contains("key tiles of a query tile must ascend (0 after 1)"), Error);
  CHECK_THROWS_WITH_AS(p.add(2, nullptr), doctest::Contains("key tile 2 is outside [0, 2)"), Error);
}

TEST_CASE("PositionMask: rows shuffled per head with their positions equal causal attention; self mask; lse") {
  const int64_t B = 2, H = 2, T = 150, D = 8;
  Rng rng(17);
  const Tensor q = random({B, H, T, D}, rng), k = random({B, H, T, D}, rng), v = random({B, H, T, D}, rng);
  const Tensor R = random({B, H, T, D}, rng);
  // A random permutation per (b, h), and its inverse.
  std::vector<int32_t> perm(B * H * T), inverse(B * H * T);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    int32_t* p = perm.data() + bh * T;
    for (int64_t t = 0; t < T; ++t) p[t] = static_cast<int32_t>(t);
    for (int64_t t = T - 1; t > 0; --t) std::swap(p[t], p[rng.below(static_cast<uint64_t>(t + 1))]);
    for (int64_t t = 0; t < T; ++t) inverse[bh * T + p[t]] = static_cast<int32_t>(t);
  }
  const IndexTensor to({B, H, T}, perm), back({B, H, T}, inverse);
  for (const bool self : {false, true}) {
    CAPTURE(self);
    const auto shuffled = [&](const std::vector<Var>& x) {
      const std::vector<Var> r = attend_positioned(gather_rows(x[0], to), gather_rows(x[1], to),
                                                      gather_rows(x[2], to), nullptr, to, to, self);
      return gather_rows(r[0], back);  // (B, H, T, D) in position order
    };
    std::vector<Scalar> diag(T * T, 0.0f);
    for (int64_t i = 0; i < T; ++i) diag[i * T + i] = self && i > 0 ? -1e5f : 0.0f;  // row 0 sees only itself
    const Tensor self_bias = Tensor::from({1, 1, T, T}, diag);
    const auto reference = [&](const std::vector<Var>& x) { return attend(x[0], x[1], x[2], {self_bias}); };
    const Run a = run(shuffled, {q, k, v}, R), b = run(reference, {q, k, v}, R);
    check_close(a.y, b.y, "value", 1e-5);
    for (size_t g = 0; g < 3; ++g) check_close(a.grads[g], b.grads[g], "gradient " + std::to_string(g), 1e-5);
  }
  // lse: log sum_{j <= i} e^(q_i . k_j / sqrt(D)), in float64.
  NoGradGuard no_grad;
  const std::vector<Var> r = attend_positioned(Var(q), Var(k), Var(v), nullptr,
                                                  IndexTensor({B, H, T}, [&] {
                                                    std::vector<int32_t> id(B * H * T);
                                                    for (size_t e = 0; e < id.size(); ++e) id[e] = static_cast<int32_t>(e % T);
                                                    return id;
                                                  }()),
                                                  IndexTensor({B, H, T}, [&] {
                                                    std::vector<int32_t> id(B * H * T);
                                                    for (size_t e = 0; e < id.size(); ++e) id[e] = static_cast<int32_t>(e % T);
                                                    return id;
                                                  }()));
  double worst = 0;
  for (int64_t i = 0; i < T; i += 7) {
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q.at({1, 0, i, d})) * k.at({1, 0, j, d});
      sum += std::exp(dot / std::sqrt(static_cast<double>(D)));
    }
    worst = std::max(worst, std::abs(r[1].value().at({1, 0, i}) - std::log(sum)));
  }
  CHECK(worst < 1e-5);
}
