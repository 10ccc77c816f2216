// VectorIndex: nearest-neighbour search over float32 vectors by squared L2
// distance, on FAISS (Debian's libfaiss-dev). The kNN-LM datastore
// (retrieval/datastore.h) searches one; layers that retrieve from a memory
// (SPALM, the Memorizing Transformer) can hold their own.
//
//   VectorIndex index(/*dim=*/C, IndexOptions{"hnsw"});
//   index.add(keys);                                  // keys (N, C): ids 0 .. N-1
//   Neighbours nb = index.search(queries, /*k=*/16);  // queries (Q, C)
//   nb.ids[q * 16 + j], nb.distances[q * 16 + j]      // (Q, k), nearest first
//
// Kinds (IndexOptions::kind):
//   exact  every key compared (faiss::IndexFlatL2): d(q, x) = ||q - x||^2 for
//          all x; the k smallest returned.
//   ivf    the keys split into `nlist` cells by k-means (faiss::IndexIVFFlat);
//          a query scans the `nprobe` cells with the nearest centroids, so it
//          costs O(nlist C + nprobe N C / nlist) and may miss neighbours in
//          other cells. The cells are learnt from the rows of the first add()
//          (at least 39 per cell, FAISS's minimum for a useful k-means).
//   hnsw   a navigable small-world graph over the keys (faiss::IndexHNSWFlat)
//          with `hnsw_m` links per node; a query walks it keeping the
//          `ef_search` best candidates: O(log N) steps, approximate.
// Every kind stores the keys as float32 and reports the squared L2 distances
// of the neighbours it returns: hnsw as ||q - x||^2, exact and ivf as
// ||q||^2 + ||x||^2 - 2 q.x, a matrix product over a block of queries (equal
// up to float rounding, clamped at 0).
//
// Threads: search() splits the queries into blocks over tapeformer's TBB
// threads (core/parallel.h), each block running FAISS single-threaded, so a
// search is reproducible for a given thread count. Building (the k-means of
// ivf, the graph of hnsw) runs FAISS's own OpenMP loops with
// parallel::num_threads() threads from the calling thread, outside any TBB
// region: the one place tapeformer lets a library other than TBB start
// threads, while TBB's workers idle. An hnsw graph built with several
// threads depends on their timing (set --threads 1 for a reproducible one).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/core/tensor.h"

namespace tapeformer {

struct IndexOptions {
  std::string kind = "exact";  // "exact" | "ivf" | "hnsw"
  int64_t nlist = 0;           // ivf: cells; 0: 4 sqrt(N) of the first add's N rows, at most N / 39 and 1024
  int64_t nprobe = 8;          // ivf: cells scanned per query
  int64_t hnsw_m = 32;         // hnsw: links per node
  int64_t ef_search = 64;      // hnsw: candidates kept while searching (at least k)
  // Error naming the option ("index: nprobe must be >= 1, got 0").
  void validate() const;
  // "exact", "ivf (nlist 1024, nprobe 8)", "hnsw (M 32, efSearch 64)".
  std::string describe() const;
};

// The rows' nearest neighbours: (n, k) row-major, nearest first; an id of -1
// (distance +inf) where the index found fewer than k (an ivf query whose
// cells hold fewer rows, an index with fewer than k rows).
struct Neighbours {
  int64_t n = 0, k = 0;
  std::vector<float> distances;  // squared L2
  std::vector<int64_t> ids;      // rows of the index, in the order added
};

class VectorIndex {
 public:
  // An empty index of `dim`-dimensional vectors (options validated).
  explicit VectorIndex(int64_t dim, const IndexOptions& options = {});
  ~VectorIndex();
  VectorIndex(VectorIndex&&) noexcept;
  VectorIndex& operator=(VectorIndex&&) noexcept;

  int64_t dim() const { return dim_; }
  int64_t size() const;
  // The options, with nlist as chosen once an ivf index is trained.
  const IndexOptions& options() const { return options_; }

  // Appends n rows (n, dim), ids size() .. size() + n - 1. An untrained ivf
  // index first learns its cells from these rows.
  void add(const float* rows, int64_t n);
  void add(const Tensor& rows);  // (N, dim), any strides

  // The k nearest rows of each query (n, dim); k >= 1.
  Neighbours search(const float* queries, int64_t n, int64_t k) const;
  Neighbours search(const Tensor& queries, int64_t k) const;  // (Q, dim)

  // The search-time options (nprobe, ef_search), changeable after building.
  void set_search_options(int64_t nprobe, int64_t ef_search);

  // The index as bytes: its options, then FAISS's own serialisation
  // (faiss::write_index), which holds the keys and the cells or graph.
  void write(std::ostream& out) const;
  // Reads what write() wrote, exactly `bytes` bytes of `in` (a seekable
  // stream); Error naming `origin` when they are not an index of this kind
  // or not one write() could have written: every FAISS count is checked
  // against the bytes left before FAISS allocates ("corrupt index (...)"),
  // then the decoded structure before anything searches it (hnsw levels,
  // offsets, links and entry point; ivf cells, centroids and ids, each id
  // in [0, size) once; every key finite, its squared norm within a float).
  // The checks read the index once, as FAISS's decoding does.
  static VectorIndex read(std::istream& in, uint64_t bytes, const std::string& origin);
  // A file of its own (core/files.h's checked layout, magic "TFVINDX1"),
  // written atomically; load refuses a truncated or corrupted file.
  void save(const std::string& path) const;
  static VectorIndex load(const std::string& path);

 private:
  struct Faiss;  // the faiss::Index, kept out of this header
  VectorIndex(int64_t dim, const IndexOptions& options, std::unique_ptr<Faiss> index);
  void build(int64_t n_first);  // makes the faiss index for a first add of n_first rows
  int64_t dim_;
  IndexOptions options_;
  std::unique_ptr<Faiss> index_;  // null until the first add (ivf's nlist depends on it)
};

}  // namespace tapeformer
