// VectorIndex against a brute-force search, its approximate kinds where they
// must be exact, save/load round trips, and the Datastore file refused when
// truncated, corrupted or inconsistent behind a valid checksum, or forged
// inside its FAISS index (graph links, cell sizes, ids, non-finite keys).
#include <doctest/doctest.h>

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>

#include "expect_error.h"
#include "file_size_limit.h"
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

namespace {

// Where the fields of a saved store's FAISS index are, in its payload (the
// layout of FAISS 1.7's write_index for IxF2, IwFl and IHNf; see
// retrieval/datastore.h for the store's own fields).
struct ForgeSites {
  size_t faiss = 0;            // the FAISS index's fourcc
  size_t first_key = 0;        // exact and hnsw: the first float of the first key
  size_t ivf_nlist = 0;        // ivf: the cell count in the ivf header (u64)
  size_t ivf_centroid = 0;     // ivf: the first float of the first centroid
  size_t ivf_sizes = 0;        // ivf: the first cell's size (u64, "full" layout)
  size_t ivf_key = 0;          // ivf: the first float of the first non-empty cell
  size_t ivf_id = 0;           // ivf: the first id of the first non-empty cell (i64)
  size_t hnsw_levels = 0;      // hnsw: levels[0] (i32)
  size_t hnsw_links = 0;       // hnsw: neighbors[0] (i32)
  uint64_t hnsw_link_count = 0;
  size_t hnsw_entry = 0;       // hnsw: entry_point (i32); max_level, efConstruction, efSearch, upper_beam follow
};

template <class T>
T at(const std::string& p, size_t offset) {
  T v{};
  std::memcpy(&v, p.data() + offset, sizeof v);
  return v;
}
template <class T>
void set(std::string& p, size_t offset, T v) {
  std::memcpy(p.data() + offset, &v, sizeof v);
}

ForgeSites forge_sites(const std::string& payload, int64_t dim) {
  ForgeSites s;
  const auto source = at<uint64_t>(payload, 40);
  const auto count = at<int64_t>(payload, 32);
  size_t i = 48 + source + 4 * static_cast<size_t>(count);  // the VectorIndex: dim, kind, 4 options, a flag
  const auto kind = at<uint64_t>(payload, i + 8);
  i += 16 + kind + 32 + 1;
  s.faiss = i;
  const size_t header = 4 + 4 + 8 + 8 + 8 + 1 + 4;  // fourcc, d, ntotal, 2 unused, is_trained, metric
  const std::string tag = payload.substr(i, 4);
  i += header;
  if (tag == "IxF2") {
    s.first_key = i + 8;
  } else if (tag == "IwFl") {
    s.ivf_nlist = i;
    const auto nlist = at<uint64_t>(payload, i);
    i += 16;  // nlist, nprobe; then the centroids, a flat index
    s.ivf_centroid = i + header + 8;
    i += header + 8 + 4 * nlist * static_cast<size_t>(dim);
    i += 1 + 8;            // an empty direct map
    i += 4 + 8 + 8;        // "ilar", nlist, code size
    REQUIRE(payload.substr(i, 4) == "full");
    s.ivf_sizes = i + 4 + 8;
    i = s.ivf_sizes + 8 * nlist;
    for (size_t cell = 0; cell < nlist; ++cell) {
      const auto n = at<uint64_t>(payload, s.ivf_sizes + 8 * cell);
      if (n == 0) continue;
      s.ivf_key = i;
      s.ivf_id = i + n * 4 * static_cast<size_t>(dim);
      break;
    }
  } else {
    REQUIRE(tag == "IHNf");
    i += 8 + 8 * at<uint64_t>(payload, i);  // level probabilities
    i += 8 + 4 * at<uint64_t>(payload, i);  // cumulative links per level
    s.hnsw_levels = i + 8;
    i += 8 + 4 * at<uint64_t>(payload, i);
    i += 8 + 8 * at<uint64_t>(payload, i);  // offsets
    s.hnsw_link_count = at<uint64_t>(payload, i);
    s.hnsw_links = i + 8;
    i += 8 + 4 * s.hnsw_link_count;
    s.hnsw_entry = i;
    s.first_key = i + 20 + header + 8;
  }
  return s;
}


}  // namespace

TEST_CASE("Datastore: a store forged inside its FAISS index behind a valid checksum is refused, naming the file") {
  TempDir dir("forged");
  const std::vector<float> keys = normal_rows(500, kDim, 11), queries = normal_rows(16, kDim, 12);
  std::vector<int32_t> values(500);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(i % 13);
  const std::string file = (dir.path / "forged.knn").string();
  const std::string named = "kNN store '" + file + "'";
  std::map<std::string, std::string> saved;  // kind: the file's bytes
  for (const char* kind : {"exact", "ivf", "hnsw"}) {
    IndexOptions o{kind};
    o.nlist = 4;
    o.nprobe = 2;
    o.hnsw_m = 4;
    Datastore store(DatastoreInfo{1, 2, 13, kDim, "forged.txt"}, o);
    store.add(keys.data(), values.data(), 500);
    store.finish();
    const std::string path = (dir.path / (std::string(kind) + ".knn")).string();
    store.save(path);
    saved[kind] = read_bytes(path);
    Datastore::load(path).index().search(queries.data(), 16, 4);  // the unforged store loads and searches
  }
  // Loads the forged payload and searches it (what eval --knn does): the
  // load must refuse it with an Error naming the file and the damage.
  const auto refused = [&](const std::string& kind, const std::string& payload, std::vector<std::string> parts) {
    CAPTURE(kind);
    CAPTURE(parts.back());
    write_bytes(file, with_payload(saved[kind], payload));
    parts.insert(parts.begin(), named + ": ");
    expect_error([&] {
      const Datastore s = Datastore::load(file);
      const Neighbours nb = s.index().search(queries.data(), 16, 8);
      for (const int64_t id : nb.ids) REQUIRE(id < s.size());
    }, parts);
  };
  const auto payload_of = [&](const std::string& kind) { return saved[kind].substr(kCheckedHeaderBytes); };

  SUBCASE("hnsw: links, levels, entry point and search beam out of range") {
    const std::string payload = payload_of("hnsw");
    const ForgeSites s = forge_sites(payload, kDim);
    std::string p = payload;
    for (uint64_t j = 0; j < s.hnsw_link_count; ++j)  // every link: the walk follows one at once
      if (at<int32_t>(p, s.hnsw_links + 4 * j) >= 0) set<int32_t>(p, s.hnsw_links + 4 * j, int32_t{1} << 30);
    refused("hnsw", p, {"corrupt index (hnsw node 0 links to 1073741824 on level 0 (500 nodes))"});
    p = payload;
    set<int32_t>(p, s.hnsw_links, 500);
    refused("hnsw", p, {"hnsw node 0 links to 500 on level 0"});
    p = payload;
    set<int32_t>(p, s.hnsw_links, -7);
    refused("hnsw", p, {"hnsw node 0 links to -7"});
    p = payload;
    set<int32_t>(p, s.hnsw_levels, 99);
    refused("hnsw", p, {"hnsw node 0 has 99 levels"});
    p = payload;
    set<int32_t>(p, s.hnsw_entry, 500);
    refused("hnsw", p, {"hnsw entry point 500"});
    p = payload;
    set<int32_t>(p, s.hnsw_entry + 4, 40);  // max_level
    refused("hnsw", p, {"on level 40"});
    p = payload;
    set<int32_t>(p, s.hnsw_entry + 16, 0);  // upper_beam: search() would write past a buffer of 0
    refused("hnsw", p, {"hnsw upper beam 0"});
    p = payload;
    set<uint64_t>(p, s.hnsw_links - 8, uint64_t{1} << 40);  // the link count
    refused("hnsw", p, {"corrupt index (the hnsw links: a count of 1099511627776 entries of 4 bytes, more than the"});
    p = payload;
    set<float>(p, s.first_key + 8, std::numeric_limits<float>::quiet_NaN());
    refused("hnsw", p, {"key 0 has a non-finite value (nan) at 2"});
  }
  SUBCASE("ivf: a cell size of 2^40, ids outside the store, cell counts, non-finite keys and centroids") {
    const std::string payload = payload_of("ivf");
    const ForgeSites s = forge_sites(payload, kDim);
    std::string p = payload;
    set<uint64_t>(p, s.ivf_sizes, uint64_t{1} << 40);
    refused("ivf", p, {"corrupt index (ivf cell 0 claims 1099511627776 keys, more than the"});
    p = payload;
    set<int64_t>(p, s.ivf_id, 500);
    refused("ivf", p, {"corrupt index (ivf cell", "holds id 500, the ids are 0 to 499)"});
    p = payload;
    set<int64_t>(p, s.ivf_id, at<int64_t>(p, s.ivf_id + 8));
    refused("ivf", p, {"twice"});
    p = payload;
    set<uint64_t>(p, s.ivf_nlist, uint64_t{1} << 40);
    refused("ivf", p, {"corrupt index (1099511627776 ivf cells with 4 centroids)"});
    p = payload;
    const std::string first = "key " + std::to_string(at<int64_t>(payload, s.ivf_id));  // the cell's first key
    set<float>(p, s.ivf_key, -std::numeric_limits<float>::infinity());
    refused("ivf", p, {first + " has a non-finite value (-inf) at 0"});
    p = payload;
    set<float>(p, s.ivf_key + 4, 3e38f);
    refused("ivf", p, {first + " is too large"});
    p = payload;
    set<float>(p, s.ivf_centroid, std::numeric_limits<float>::quiet_NaN());
    refused("ivf", p, {"ivf centroid 0 has a non-finite value (nan)"});
  }
  SUBCASE("exact: a NaN key, and a key count beyond the file") {
    const std::string payload = payload_of("exact");
    const ForgeSites s = forge_sites(payload, kDim);
    std::string p = payload;
    set<float>(p, s.first_key + 4 * (3 * kDim + 1), std::numeric_limits<float>::quiet_NaN());
    refused("exact", p, {"key 3 has a non-finite value (nan) at 1"});
    p = payload;
    set<uint64_t>(p, s.first_key - 8, uint64_t{1} << 40);
    refused("exact", p, {"the keys: a count of 1099511627776 entries of 4 bytes"});
    p = payload;
    set<uint32_t>(p, s.faiss, 0x6c6c756eU);  // "null": FAISS returns no index
    refused("exact", p, {"FAISS type \"null\" for the keys, expected \"IxF2\""});
  }
}

TEST_CASE("Datastore save: a write cut short names the store and says why, and keeps the old file") {
  TempDir dir("store-full");
  const std::string path = (dir.path / "s.knn").string();
  // 40,000 keys: the payload outgrows the file sink's 1 MB buffer, so the
  // write fails inside FAISS's serialisation; 50 keys: at the final flush.
  for (const int64_t n : {int64_t{50}, int64_t{40000}}) {
    CAPTURE(n);
    const std::vector<float> keys = normal_rows(n, kDim, 13);
    const std::vector<int32_t> values(static_cast<size_t>(n), 1);
    Datastore store(DatastoreInfo{1, 2, 13, kDim, "x"}, IndexOptions{"exact"});
    store.add(keys.data(), values.data(), n);
    store.finish();
    write_bytes(path, "old");
    {
      FileSizeLimit limit(n == 50 ? 200 : 100000);
      expect_error([&] { store.save(path); },
                   {"cannot write the kNN store '" + path + "': file too large (ulimit -f?)"});
    }
    CHECK(read_bytes(path) == "old");
    for (const auto& e : std::filesystem::directory_iterator(dir.path)) CHECK(e.path().filename() == "s.knn");
  }
}
