// The Image Transformer's local attention patterns (layers/attention/image_local.cpp):
// which keys a query's memory block holds, by hand on a small image; a query
// block covering the image is full attention; values and gradients equal a
// PyTorch version with the mask built independently.
#include <doctest/doctest.h>

#include <set>

#include "kind_tests.h"
#include "tapeformer/autograd/ops.h"
#include "tapeformer/autograd/tape.h"
#include "tapeformer/layers/attention/sparse.h"

using namespace tapeformer;
using namespace kind_tests;

namespace {

std::shared_ptr<const SparsePattern> pattern(const std::string& kind, const std::map<std::string, int64_t>& options) {
  ModelConfig c;
  c.attention = kind;
  for (const auto& [name, value] : options) c.options[name] = value;
  return sparse_pattern_kinds().get(kind).make(c);
}

Var attend(const SparsePattern& p, const Var& q, const Var& k, const Var& v) {
  const int64_t T = q.dim(2);
  return sparse_attention(p, q, k, v, {}, 0, 0, 0.0f, nullptr,
                          [&](int64_t, const SparsePattern& g) { return tile_pattern(g, T, T, 0, 0); });
}

std::set<int64_t> keys_of(const SparsePattern& p, int64_t i) {
  std::set<int64_t> keys;
  for (int64_t j = 0; j <= i + 3; ++j)
    if (p.sees(i, j)) keys.insert(j);
  return keys;
}

}  // namespace

TEST_CASE("image_2d: a query sees the start token and the earlier pixels of its memory block") {
  // A 4-wide image, query blocks of 2 x 2, one row above and one column on
  // each side. Query 10 predicts pixel (2, 2): its block is rows 2-3,
  // columns 2-3; the memory block rows 1-3, columns 1-3 (4 clipped). Earlier
  // pixels there: 5, 6, 7 (row 1) and 9 (row 2), at keys 6, 7, 8 and 10.
  const auto p = pattern("image_2d", {{"image_width", 4}, {"image_block_rows", 2}, {"image_block_cols", 2},
                                      {"image_memory_rows", 1}, {"image_memory_cols", 1}});
  CHECK(keys_of(*p, 10) == std::set<int64_t>{0, 6, 7, 8, 10});
  CHECK(keys_of(*p, 0) == std::set<int64_t>{0});  // pixel 0: the start token only
  CHECK(keys_of(*p, 5) == std::set<int64_t>{0, 1, 2, 3, 5});  // pixel (1, 1): block rows 0-1, columns 0-2
  // 1-D: blocks of 4 pixels and 2 before: query 9 (block 8-11) sees pixels 6-8, keys 7-9.
  const auto q = pattern("image_1d", {{"image_query", 4}, {"image_memory", 2}});
  CHECK(keys_of(*q, 9) == std::set<int64_t>{0, 7, 8, 9});
  CHECK(keys_of(*q, 8) == std::set<int64_t>{0, 7, 8});
}

TEST_CASE("image local attention with a query block covering the image is full attention") {
  // 64 positions: the start token and pixels 0-62 in, pixels 0-63 predicted (an 8 x 8 image).
  const Tensor q = normal({2, 2, 64, 4}, 1), k = normal({2, 2, 64, 4}, 2), v = normal({2, 2, 64, 4}, 3);
  AttentionSpec causal;
  const Tensor full = softmax_attention(Var(q), Var(k), Var(v), causal).value();
  const auto whole_2d = pattern("image_2d", {{"image_width", 8}, {"image_block_rows", 8}, {"image_block_cols", 8},
                                             {"image_memory_rows", 0}, {"image_memory_cols", 0}});
  check_close(attend(*whole_2d, Var(q), Var(k), Var(v)).value(), full, "2-D, one block", 1e-6);
  const auto whole_1d = pattern("image_1d", {{"image_query", 64}, {"image_memory", 0}});
  check_close(attend(*whole_1d, Var(q), Var(k), Var(v)).value(), full, "1-D, one block", 1e-6);
  const auto local = pattern("image_2d", {{"image_width", 8}, {"image_block_rows", 2}, {"image_block_cols", 4},
                                          {"image_memory_rows", 2}, {"image_memory_cols", 2}});
  CHECK(max_abs_diff(attend(*local, Var(q), Var(k), Var(v)).value(), full) > 1e-3);  // smaller blocks: not full
}

TEST_CASE("image local attention: values and gradients equal PyTorch's masked softmax (1-D and 2-D)") {
  const std::map<std::string, std::map<std::string, int64_t>> options{
      {"image_1d", {{"image_query", 8}, {"image_memory", 12}}},
      {"image_2d",
       {{"image_width", 8}, {"image_block_rows", 2}, {"image_block_cols", 4}, {"image_memory_rows", 2},
        {"image_memory_cols", 2}}}};
  for (const auto& [kind, o] : options) {
    INFO(kind);
    const Golden g = reference(kind);
    Var q(g.tensor("q"), true), k(g.tensor("k"), true), v(g.tensor("v"), true);
    const Var out = attend(*pattern(kind, o), q, k, v);
    check_close(out.value(), g.tensor("out"), kind + ": out");
    backward(out, g.tensor("R"));
    check_close(q.grad(), g.tensor("grad_q"), "grad_q");
    check_close(k.grad(), g.tensor("grad_k"), "grad_k");
    check_close(v.grad(), g.tensor("grad_v"), "grad_v");
  }
}
