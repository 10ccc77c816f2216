// VectorIndex against a brute-force search, its approximate kinds where they
// must be exact, save/load round trips, and the Datastore file refused when
// truncated, corrupted or inconsistent behind a valid checksum.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <sstream>

#include "expect_error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/core/rng.h"
#include "tapeformer/retrieval/datastore.h"
#include "temp_dir.h"

using namespace tapeformer;

namespace {

// n rows of dim normal floats.
std::vector<float> normal_rows(int64_t n, int64_t dim, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n * dim));
  for (float& x : v) x = rng.normal();
  return v;
}

// The k nearest rows of `keys` to each query by squared L2, in double,
// nearest first (ties: the lower id).
Neighbours brute_force(const std::vector<float>& keys, const std::vector<float>& queries, int64_t dim, int64_t k) {
  const int64_t n = static_cast<int64_t>(keys.size()) / dim, q = static_cast<int64_t>(queries.size()) / dim;
  Neighbours out;
  out.n = q;
  out.k = k;
  for (int64_t i = 0; i < q; ++i) {
    std::vector<std::pair<double, int64_t>> d(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < dim; ++c) {
        const double diff = static_cast<double>(queries[i * dim + c]) - keys[j * dim + c];
        s += diff * diff;
      }
      d[static_cast<size_t>(j)] = {s, j};
    }
    std::sort(d.begin(), d.end());
    for (int64_t j = 0; j < k; ++j) {
      out.distances.push_back(static_cast<float>(d[static_cast<size_t>(j)].first));
      out.ids.push_back(d[static_cast<size_t>(j)].second);
    }
  }
  return out;
}

void check_same(const Neighbours& got, const Neighbours& want) {
  REQUIRE(got.n == want.n);
  REQUIRE(got.k == want.k);
  for (size_t i = 0; i < want.ids.size(); ++i) {
    CAPTURE(i);
    CHECK(got.ids[i] == want.ids[i]);
    CHECK(got.distances[i] == doctest::Approx(want.distances[i]).epsilon(1e-4));
  }
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// The file with its payload replaced, the header's length and checksum
// made to match (damage that only the field checks can catch).
std::string with_payload(const std::string& file, const std::string& payload) {
  std::string out = file.substr(0, kCheckedHeaderBytes) + payload;
  const uint64_t length = payload.size(), hash = fnv1a64(payload);
  std::memcpy(out.data() + 12, &length, sizeof length);
  std::memcpy(out.data() + 20, &hash, sizeof hash);
  return out;
}

constexpr int64_t kDim = 7;

}  // namespace

TEST_CASE("VectorIndex exact: the k nearest of a brute-force search, for contiguous and strided queries") {
  const std::vector<float> keys = normal_rows(300, kDim, 1), queries = normal_rows(45, kDim, 2);
  VectorIndex index(kDim);
  index.add(keys.data(), 120);  // two adds: ids continue
  index.add(Tensor::from({180, kDim}, std::vector<float>(keys.begin() + 120 * kDim, keys.end())));
  CHECK(index.size() == 300);
  const Neighbours want = brute_force(keys, queries, kDim, 5);
  check_same(index.search(queries.data(), 45, 5), want);
  // The same queries as a transposed view (strides (1, 45)).
  const Tensor qt = Tensor::from({kDim, 45}, [&] {
    std::vector<float> t(queries.size());
    for (int64_t i = 0; i < 45; ++i)
      for (int64_t c = 0; c < kDim; ++c) t[c * 45 + i] = queries[i * kDim + c];
    return t;
  }()).transpose(0, 1);
  check_same(index.search(qt, 5), want);
}

TEST_CASE("VectorIndex ivf and hnsw: exact where their parameters say so, and approximate otherwise") {
  const std::vector<float> keys = normal_rows(2000, kDim, 3), queries = normal_rows(40, kDim, 4);
  const Neighbours want = brute_force(keys, queries, kDim, 4);
  IndexOptions ivf{"ivf"};
  ivf.nlist = 16;
  ivf.nprobe = 16;  // every cell: exact
  VectorIndex a(kDim, ivf);
  a.add(keys.data(), 2000);
  check_same(a.search(queries.data(), 40, 4), want);
  // One cell of 16 misses some true neighbours, but finds most.
  a.set_search_options(1, 64);
  const Neighbours one = a.search(queries.data(), 40, 4);
  int64_t found = 0;
  for (int64_t q = 0; q < 40; ++q)
    for (int64_t j = 0; j < 4; ++j)
      found += std::count(one.ids.begin() + q * 4, one.ids.begin() + q * 4 + 4, want.ids[q * 4 + j]);
  CHECK(found < 160);
  CHECK(found > 80);

  IndexOptions hnsw{"hnsw"};
  hnsw.ef_search = 2000;  // the whole graph is a candidate list: exact on 2000 rows
  VectorIndex b(kDim, hnsw);
  b.add(keys.data(), 2000);
  check_same(b.search(queries.data(), 40, 4), want);

  // auto nlist: 4 sqrt(2000) = 179, at most 2000 / 39 = 51 cells.
  VectorIndex c(kDim, IndexOptions{"ivf"});
  c.add(keys.data(), 2000);
  CHECK(c.options().nlist == 51);
}

TEST_CASE("VectorIndex: fewer rows than k give id -1 at +inf; bad options and shapes are refused") {
  VectorIndex index(kDim);
  const std::vector<float> keys = normal_rows(3, kDim, 5);
  index.add(keys.data(), 3);
  const Neighbours nb = index.search(keys.data(), 1, 5);
  CHECK(nb.ids[0] == 0);
  CHECK(nb.distances[0] == doctest::Approx(0).epsilon(1e-6));
  CHECK(nb.ids[3] == -1);
  CHECK(nb.ids[4] == -1);
  CHECK(std::isinf(nb.distances[4]));
  expect_error([&] { VectorIndex(kDim, IndexOptions{"annoy"}); }, {"index: unknown kind \"annoy\" (known: exact, ivf, hnsw)"});
  IndexOptions o{"ivf"};
  o.nlist = 10;
  o.nprobe = 11;
  expect_error([&] { VectorIndex(kDim, o); }, {"nprobe 11 exceeds nlist 10"});
  o.nprobe = 2;
  VectorIndex ivf(kDim, o);
  const std::vector<float> few = normal_rows(100, kDim, 6);
  expect_error([&] { ivf.add(few.data(), 100); }, {"ivf with nlist 10 learns its cells from at least 390 rows",
                                                   "the first add has 100"});
  expect_error([&] { index.search(keys.data(), 1, 0); }, {"index: k must be in [1, 2^20], got 0"});
  expect_error([&] { index.add(Tensor::zeros({2, kDim + 1})); }, {"rows must be (N, 7), got [2, 8]"});
  expect_error([&] { index.search(Tensor::zeros({2, 3}), 1); }, {"queries must be (Q, 7), got [2, 3]"});
}

TEST_CASE("VectorIndex save and load: the same neighbours for every kind; damaged files refused") {
  TempDir dir("vindex");
  const std::vector<float> keys = normal_rows(800, kDim, 7), queries = normal_rows(20, kDim, 8);
  for (const char* kind : {"exact", "ivf", "hnsw"}) {
    CAPTURE(kind);
    IndexOptions o{kind};
    o.nlist = 8;
    o.nprobe = 3;
    o.ef_search = 24;
    VectorIndex index(kDim, o);
    index.add(keys.data(), 800);
    const std::string path = (dir.path / (std::string(kind) + ".idx")).string();
    index.save(path);
    const VectorIndex again = VectorIndex::load(path);
    CHECK(again.size() == 800);
    CHECK(again.options().describe() == index.options().describe());
    const Neighbours a = index.search(queries.data(), 20, 6), b = again.search(queries.data(), 20, 6);
    CHECK(a.ids == b.ids);
    CHECK(a.distances == b.distances);
  }
  const std::string path = (dir.path / "exact.idx").string();
  const std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 9));
  expect_error([&] { VectorIndex::load(path); }, {"vector index '" + path + "': truncated"});
}

TEST_CASE("Datastore: round trip of keys, values and header; refused when damaged or inconsistent") {
  TempDir dir("datastore");
  const std::vector<float> keys = normal_rows(500, kDim, 9);
  std::vector<int32_t> values(500);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>((i * 7) % 13);
  DatastoreInfo info{0x1234abcdULL, 0x99ULL, 13, kDim, "numbers.txt"};
  Datastore store(info, IndexOptions{"exact"});
  store.add(keys.data(), values.data(), 200);
  store.add(keys.data() + 200 * kDim, values.data() + 200, 300);
  const std::string path = (dir.path / "s.knn").string();
  expect_error([&] { store.save(path); }, {"save before finish()"});
  store.finish();
  expect_error([&] { store.add(keys.data(), values.data(), 1); }, {"add after finish()"});
  store.save(path);

  const Datastore again = Datastore::load(path);
  CHECK(again.size() == 500);
  CHECK(again.info().model_fingerprint == info.model_fingerprint);
  CHECK(again.info().tokenizer_fingerprint == info.tokenizer_fingerprint);
  CHECK(again.info().vocab_size == 13);
  CHECK(again.info().dim == kDim);
  CHECK(again.info().source == "numbers.txt");
  CHECK(again.values() == values);
  // Each key is its own nearest neighbour: the keys came back in order.
  const Neighbours nb = again.index().search(keys.data(), 500, 1);
  std::vector<int64_t> order(500);
  std::iota(order.begin(), order.end(), 0);
  CHECK(nb.ids == order);

  const int32_t bad = 13;
  expect_error([&] { Datastore(info, IndexOptions{}).add(keys.data(), &bad, 1); },
               {"value 13 is outside the vocabulary of 13"});

  const std::string bytes = read_bytes(path);
  const std::string file = (dir.path / "damaged.knn").string();
  write_bytes(file, bytes.substr(0, bytes.size() / 2));
  expect_error([&] { Datastore::load(file); }, {"kNN store '" + file + "': truncated ("});
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x40;
  write_bytes(file, flipped);
  expect_error([&] { Datastore::load(file); }, {"kNN store '" + file + "': corrupted (checksum mismatch)"});
  write_bytes(file, bytes + "x");
  expect_error([&] { Datastore::load(file); }, {"corrupted (1 bytes after the"});
  write_bytes(file, "The quick brown fox jumps over the lazy dog, and more text.");
  expect_error([&] { Datastore::load(file); }, {"kNN store '" + file + "': not a tapeformer kNN store (bad header)"});
  expect_error([&] { Datastore::load((dir.path / "nothing.knn").string()); }, {"nothing.knn': cannot open"});
  expect_error([&] { Datastore::load(dir.path.string()); }, {"is a directory"});

  // Behind a valid checksum: a value outside the vocabulary, a count the
  // bytes cannot hold, an index of another size.
  const std::string payload = bytes.substr(kCheckedHeaderBytes);
  const size_t values_at = 8 + 8 + 8 + 8 + 8 + 8 + info.source.size();
  std::string p = payload;
  const int32_t big = 99;
  std::memcpy(p.data() + values_at + 4 * 3, &big, sizeof big);
  write_bytes(file, with_payload(bytes, p));
  expect_error([&] { Datastore::load(file); }, {"value 99 at 3 is outside the vocabulary of 13"});
  p = payload;
  const int64_t huge = int64_t{1} << 40;
  std::memcpy(p.data() + 32, &huge, sizeof huge);
  write_bytes(file, with_payload(bytes, p));
  expect_error([&] { Datastore::load(file); }, {"cannot decode (a count of 1099511627776 pairs"});
  p = payload;
  const int64_t fewer = 499;
  std::memcpy(p.data() + 32, &fewer, sizeof fewer);
  p.erase(values_at + 499 * 4, 4);  // one value less: the index still holds 500 keys
  write_bytes(file, with_payload(bytes, p));
  expect_error([&] { Datastore::load(file); }, {"the index holds 500 keys of width 7 for 499 values"});
}
