#include <doctest/doctest.h>

#include <sstream>

#include "tapeformer/core/error.h"
#include "tapeformer/core/tensor.h"

using namespace tapeformer;

namespace {
Tensor iota(const Shape& s) {
  std::vector<Scalar> v(s.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<Scalar>(i);
  return Tensor::from(s, v);
}
}  // namespace

TEST_CASE("Shape prints, counts and indexes from the end") {
  Shape s{2, 3, 4};
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(Shape{}.str() == "[]");
  CHECK(s.numel() == 24);
  CHECK(s[-1] == 4);
  CHECK(contiguous_strides(s) == Shape{12, 4, 1});
  CHECK(broadcast_shapes({3, 1, 5}, {4, 1}, "t") == Shape{3, 4, 5});
}

TEST_CASE("element counts that overflow 64 bits, or exceed any memory, are errors, not small buffers") {
  const int64_t big = int64_t{1} << 40;
  CHECK_THROWS_WITH_AS(Shape({big, big}).numel(), "shape [1099511627776, 1099511627776] has more elements than fit in 64 bits",
                       Error);
  CHECK_THROWS_WITH_AS(Tensor::empty({big, big}), doctest::Contains("more elements than fit in 64 bits"), Error);
  CHECK_THROWS_WITH_AS(Tensor::empty({big, 1 << 20}), doctest::Contains("more than any machine can hold"), Error);
}

TEST_CASE("storage is 64-byte aligned") {
  for (int64_t n : {1, 3, 17, 1000}) {
    Tensor t = Tensor::empty({n});
    CHECK(reinterpret_cast<uintptr_t>(t.data()) % 64 == 0);
  }
}

TEST_CASE("transpose/permute/slice/expand are views; contiguous copies in row-major order") {
  Tensor x = iota({2, 3, 4});
  Tensor t = x.transpose(0, 2);  // [4, 3, 2]
  CHECK(t.shares_storage(x));
  CHECK_FALSE(t.is_contiguous());
  CHECK(t.at({3, 1, 0}) == x.at({0, 1, 3}));
  Tensor c = t.contiguous();
  CHECK(c.is_contiguous());
  CHECK_FALSE(c.shares_storage(x));
  CHECK(c.at({3, 2, 1}) == x.at({1, 2, 3}));

  Tensor p = x.permute({1, 2, 0});  // [3, 4, 2]
  CHECK(p.shape() == Shape{3, 4, 2});
  CHECK(p.at({2, 1, 1}) == x.at({1, 2, 1}));

  Tensor s = x.slice(2, 1, 3);  // [2, 3, 2]
  CHECK(s.shares_storage(x));
  CHECK(s.at({1, 2, 0}) == x.at({1, 2, 1}));
  CHECK(s.to_vector() == std::vector<Scalar>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22});

  Tensor e = Tensor::from({3, 1}, {1, 2, 3}).expand({2, 3, 4});
  CHECK(e.strides() == Shape{0, 1, 0});
  CHECK(e.at({1, 2, 3}) == 3);
  CHECK(e.contiguous().to_vector().size() == 24);
}

TEST_CASE("reshape is a view of contiguous data and infers -1") {
  Tensor x = iota({2, 3, 4});
  Tensor r = x.reshape({4, -1});
  CHECK(r.shape() == Shape{4, 6});
  CHECK(r.shares_storage(x));
  Tensor rt = x.transpose(0, 1).reshape({6, 4});  // non-contiguous: copies
  CHECK_FALSE(rt.shares_storage(x));
  CHECK(rt.at({1, 0}) == x.at({1, 0, 0}));
}

TEST_CASE("unsqueeze/squeeze, fill of a strided view, clone independence") {
  Tensor x = iota({2, 3});
  CHECK(x.unsqueeze(1).shape() == Shape{2, 1, 3});
  CHECK(x.unsqueeze(-1).shape() == Shape{2, 3, 1});
  CHECK(x.unsqueeze(1).squeeze(1).shape() == Shape{2, 3});
  Tensor col = x.slice(1, 1, 2);
  col.fill(-1);
  CHECK(x.to_vector() == std::vector<Scalar>{0, -1, 2, 3, -1, 5});
  Tensor y = x.clone();
  y.fill(7);
  CHECK(x.at({0, 0}) == 0);
}

TEST_CASE("errors name the operation and the shapes") {
  Tensor x = iota({2, 3});
  try {
    x.reshape({4, 2});
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("[2, 3]") != std::string::npos);
    CHECK(std::string(e.what()).find("[4, 2]") != std::string::npos);
  }
  CHECK_THROWS_AS(x.transpose(0, 2), Error);
  CHECK_THROWS_AS(x.expand({3, 3}), Error);
}

TEST_CASE("reshape views strided tensors when their strides allow it") {
  Tensor x = iota({2, 3, 4, 5});
  // Splitting the last dim of a sliced view: still a view.
  Tensor s = x.slice(0, 1, 2);  // [1, 3, 4, 5]
  Tensor r = s.reshape({3, 4, 5});
  CHECK(r.shares_storage(x));
  CHECK(r.at({2, 3, 4}) == x.at({1, 2, 3, 4}));
  // Merging dims permuted apart is not a view: it copies, values still row-major.
  Tensor p = x.permute({0, 2, 1, 3});  // [2, 4, 3, 5]
  Tensor m = p.reshape({8, 15});
  CHECK_FALSE(m.shares_storage(x));
  CHECK(m.at({5, 7}) == p.at({1, 1, 1, 2}));
  // Merging dims that stay adjacent in memory in a permuted view is a view.
  Tensor p2 = x.permute({1, 0, 2, 3});  // [3, 2, 4, 5], last two dims untouched
  Tensor q = p2.reshape({3, 2, 20});
  CHECK(q.shares_storage(x));
  CHECK(q.at({2, 1, 19}) == p2.at({2, 1, 3, 4}));
  // A column slice of a matrix, reshaped with size-1 dims added.
  Tensor c = iota({4, 6}).slice(1, 2, 3);  // [4, 1], stride 6
  Tensor c2 = c.reshape({2, 2, 1});
  CHECK(c2.at({1, 1, 0}) == 20);
}

TEST_CASE("Tensor::over a borrowed storage: a view of memory the storage does not own") {
  std::vector<float> memory = {1, 2, 3, 4, 5, 6, 7};
  const int64_t live = Storage::live_count();
  std::shared_ptr<Storage> s = Storage::borrow(memory.data(), 7);
  CHECK(Storage::live_count() == live);  // not counted: nothing of it is this process's to free
  Tensor t = Tensor::over(s, Shape{2, 2}, 2);
  CHECK(t.data() == memory.data() + 2);
  CHECK(t.is_contiguous());
  CHECK(t.at({1, 1}) == 6.0f);
  memory[5] = -1;
  CHECK(t.at({1, 1}) == -1.0f);  // the memory itself, not a copy
  CHECK_THROWS_WITH_AS(Tensor::over(s, Shape{2, 3}, 2), doctest::Contains("does not fit a storage of 7 floats"), Error);
  t = Tensor();
  s.reset();  // frees nothing: the vector still owns its memory
  CHECK(memory[0] == 1.0f);
}
