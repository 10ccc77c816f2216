// Fuzz target: reading a kNN-LM store (retrieval/datastore.h) and the vector
// index inside one (retrieval/vector_index.h), whose FAISS part FAISS decodes
// and searches without checks of its own.
// - The input, as a whole file, is accepted or refused with tapeformer::Error.
// - The input as a store's payload behind a valid header (magic, version,
//   length, checksum), so that decoding is reached past the checksum, and as
//   a vector index's payload behind its own header: likewise.
// - An accepted store or index answers a few queries without crashing: ids
//   in [-1, size), no NaN distance, -1 only at +inf; an exhaustive search
//   (exact, or ivf scanning every cell, with k = size) returns every key
//   once, at a finite distance (a NaN key would be missing or at NaN); a
//   store's values lie in its vocabulary.
// A bad_alloc is not an Error: a huge allocation is a crash here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz.h"
#include "tapeformer/core/files.h"
#include "tapeformer/retrieval/datastore.h"
#include "temp_dir.h"

namespace {

using namespace tapeformer;

// A checked file (core/files.h's layout) holding `payload`.
std::string checked_file(const char (&magic)[9], const std::string& payload) {
  std::string out(magic, 8);
  const uint32_t version = 1;
  const uint64_t length = payload.size(), hash = fnv1a64(payload);
  out.append(reinterpret_cast<const char*>(&version), sizeof version);
  out.append(reinterpret_cast<const char*>(&length), sizeof length);
  out.append(reinterpret_cast<const char*>(&hash), sizeof hash);
  return out + payload;
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Three queries (zeros, ones, alternating +-1000), k of 1 and 5, then
// every key where the kind can search exhaustively.
void search_some(VectorIndex& index) {
  const int64_t d = index.dim();
  std::vector<float> queries(static_cast<size_t>(3 * d), 0.0f);
  for (int64_t c = 0; c < d; ++c) {
    queries[static_cast<size_t>(d + c)] = 1.0f;
    queries[static_cast<size_t>(2 * d + c)] = c % 2 == 0 ? 1000.0f : -1000.0f;
  }
  for (const int64_t k : {int64_t{1}, int64_t{5}}) {
    const Neighbours nb = index.search(queries.data(), 3, k);
    fuzz::require(nb.ids.size() == static_cast<size_t>(3 * k) && nb.distances.size() == nb.ids.size(),
                  "a search returned other than (n, k) results");
    for (size_t i = 0; i < nb.ids.size(); ++i) {
      fuzz::require(nb.ids[i] >= -1 && nb.ids[i] < index.size(), "a search returned an id outside the index");
      fuzz::require(!std::isnan(nb.distances[i]), "a search returned a NaN distance");
      fuzz::require(nb.ids[i] >= 0 || std::isinf(nb.distances[i]), "a search returned id -1 at a finite distance");
    }
  }
  const std::string& kind = index.options().kind;
  if (kind == "hnsw" || index.size() > 4096) return;
  if (kind == "ivf") index.set_search_options(index.options().nlist, index.options().ef_search);
  const int64_t n = index.size();
  const Neighbours all = index.search(queries.data(), 1, n);
  std::vector<int64_t> ids = all.ids, want(static_cast<size_t>(n));
  std::sort(ids.begin(), ids.end());
  std::iota(want.begin(), want.end(), 0);
  fuzz::require(ids == want, "an exhaustive search did not return every key once");
  for (const float d : all.distances) fuzz::require(std::isfinite(d), "a key is at a non-finite distance from zero");
}

void load_store(const std::string& path, const std::string& bytes) {
  write(path, bytes);
  fuzz::refused_or_done([&] {
    Datastore store = Datastore::load(path);
    fuzz::require(store.finished() && store.size() >= 1 && store.index().size() == store.size() &&
                      store.index().dim() == store.info().dim,
                  "an accepted store's index differs from its values");
    for (const int32_t v : store.values())
      fuzz::require(v >= 0 && v < store.info().vocab_size, "an accepted store holds a value outside its vocabulary");
    search_some(store.index());
  });
}

void load_index(const std::string& path, const std::string& bytes) {
  write(path, bytes);
  fuzz::refused_or_done([&] {
    VectorIndex index = VectorIndex::load(path);
    search_some(index);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const TempDir dir("fuzz-store");  // scratch files per process, removed at exit
  static const std::string store_path = (dir.path / "store.knn").string();
  static const std::string index_path = (dir.path / "index.idx").string();
  const std::string input(reinterpret_cast<const char*>(data), size);

  load_store(store_path, input);
  load_store(store_path, checked_file("TFKNNDS1", input));
  load_index(index_path, checked_file("TFVINDX1", input));
  return 0;
}
