#include "tapeformer/retrieval/vector_index.h"

#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIVFFlat.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/DistanceComputer.h>
#include <faiss/impl/io.h>
#include <faiss/index_io.h>
#include <faiss/invlists/DirectMap.h>
#include <faiss/invlists/InvertedLists.h>
#include <faiss/utils/distances.h>
#include <omp.h>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <istream>
#include <limits>
#include <new>
#include <ostream>
#include <stdexcept>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/core/kernels/matmul.h"
#include "tapeformer/core/kernels/vector_loops.h"
#include "tapeformer/core/parallel.h"
#include "tapeformer/retrieval/bounded_reader.h"

namespace tapeformer {

struct VectorIndex::Faiss {
  std::unique_ptr<faiss::Index> index;
};

// Defined with the BLAS routines FAISS calls (retrieval/blas.cpp): using it
// here makes a static link take that object before it reaches libfaiss.a.
extern int retrieval_blas_linked;

namespace {

// A cell of an ivf index needs this many rows for k-means to place its
// centroid usefully (FAISS's own min_points_per_centroid, whose warning it
// would print to stderr; tapeformer refuses instead).
constexpr int64_t kRowsPerCell = 39;

// OpenMP threads for FAISS on this thread while the guard lives.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : before_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~OmpThreads() { omp_set_num_threads(before_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int before_;
};

// Runs a FAISS call, its exceptions as Errors naming `what`.
template <class F>
auto faiss_call(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const faiss::FaissException& e) {
    fail("index: ", what, ": ", e.what());
  }
}

// Squared L2 distances, vectorised. Debian's libfaiss.a is built for any
// x86-64, so its own distance loop (faiss::fvec_L2sqr) runs one float at a
// time: an ivf scan or an hnsw walk spent nearly all its time there, 20
// times what the model took to evaluate. The two places that compute
// distances one vector at a time are replaced below; matrix products (exact
// search, k-means, ivf's cell assignment) go through sgemm_ (blas.cpp).
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
float l2sqr(const float* a, const float* b, int64_t d) { return kernels::vec::dist2(a, b, d); }

// An IndexFlatL2 whose distance computer (what IndexHNSW walks its graph
// with) uses l2sqr. It is stored and read back as a plain IndexFlatL2.
struct FastFlatL2 : faiss::IndexFlatL2 {
  explicit FastFlatL2(int d) : faiss::IndexFlatL2(d) {}
  struct Distances : faiss::FlatCodesDistanceComputer {
    explicit Distances(const FastFlatL2& s)
        : faiss::FlatCodesDistanceComputer(s.codes.data(), s.code_size), d(s.d) {}
    void set_query(const float* x) override { q = x; }
    float distance_to_code(const uint8_t* code) override {
      return l2sqr(q, reinterpret_cast<const float*>(code), d);
    }
    float symmetric_dis(idx_t i, idx_t j) override {
      const auto* x = reinterpret_cast<const float*>(codes);
      return l2sqr(x + i * d, x + j * d, d);
    }
    const float* q = nullptr;
    int64_t d;
  };
  faiss::FlatCodesDistanceComputer* get_FlatCodesDistanceComputer() const override { return new Distances(*this); }
};

// An hnsw index's storage (a plain IndexFlat when new or read back) as a
// FastFlatL2 holding the same keys.
void use_fast_storage(faiss::IndexHNSW& h) {
  if (dynamic_cast<FastFlatL2*>(h.storage) != nullptr) return;
  auto* flat = dynamic_cast<faiss::IndexFlat*>(h.storage);
  FAISS_THROW_IF_NOT_MSG(flat != nullptr && flat->metric_type == faiss::METRIC_L2,
                         "hnsw storage is not a flat L2 index");
  auto fast = std::make_unique<FastFlatL2>(static_cast<int>(flat->d));
  fast->codes.swap(flat->codes);
  fast->ntotal = flat->ntotal;
  if (h.own_fields) delete h.storage;
  h.storage = fast.release();
  h.own_fields = true;
}

// The k nearest of each query among the rows of the nprobe cells whose
// centroids are nearest (IndexIVFFlat's search). The queries of a block that
// probe the same cell are compared with its rows as one matrix product,
// ||q||^2 + ||x||^2 - 2 q.x (as exact search computes it): a cell is read
// from memory once per block, not once per query, and consecutive
// positions of a text tend to probe the same cells.
void ivf_search(const faiss::IndexIVF& ivf, const float* x, int64_t n, int64_t k, float* distances, int64_t* ids) {
  const auto nprobe = static_cast<int64_t>(std::min(ivf.nprobe, ivf.nlist));
  const int64_t d = ivf.d;
  std::vector<float> centroid_d(static_cast<size_t>(n * nprobe));
  std::vector<faiss::Index::idx_t> cells(static_cast<size_t>(n * nprobe));
  ivf.quantizer->search(n, x, nprobe, centroid_d.data(), cells.data());
  // The queries probing each cell, cells in order of first use.
  std::vector<std::pair<faiss::Index::idx_t, int64_t>> probes;  // (cell, query)
  for (int64_t q = 0; q < n; ++q)
    for (int64_t p = 0; p < nprobe; ++p)
      if (cells[static_cast<size_t>(q * nprobe + p)] >= 0) probes.emplace_back(cells[static_cast<size_t>(q * nprobe + p)], q);
  std::sort(probes.begin(), probes.end());
  using Heap = std::vector<std::pair<float, int64_t>>;  // the k best so far, the worst on top
  std::vector<Heap> heaps(static_cast<size_t>(n));
  const Eigen::Map<const RowMatrix> queries(x, n, d);  // (n, C)
  RowMatrix group, dist;
  Eigen::VectorXf row_norms;
  for (size_t g = 0; g < probes.size();) {
    const faiss::Index::idx_t cell = probes[g].first;
    size_t end = g;
    while (end < probes.size() && probes[end].first == cell) ++end;
    const auto size = static_cast<int64_t>(ivf.invlists->list_size(static_cast<size_t>(cell)));
    if (size > 0) {
      faiss::InvertedLists::ScopedCodes codes(ivf.invlists, static_cast<size_t>(cell));
      faiss::InvertedLists::ScopedIds row_ids(ivf.invlists, static_cast<size_t>(cell));
      const Eigen::Map<const RowMatrix> rows(reinterpret_cast<const float*>(codes.get()), size, d);  // (n_cell, C)
      const auto m = static_cast<int64_t>(end - g);
      group.resize(m, d);  // the queries probing this cell, (m, C)
      for (int64_t i = 0; i < m; ++i) group.row(i) = queries.row(probes[g + static_cast<size_t>(i)].second);
      // Norms and products in tapeformer's kernels: one summation order on every machine.
      row_norms.resize(size);
      for (int64_t j = 0; j < size; ++j) row_norms[j] = kernels::vec::dot(rows.data() + j * d, rows.data() + j * d, d);
      dist.resize(m, size);
      kernels::gemm_fp32({group.data(), m, d, d, 1}, {rows.data(), d, size, 1, d}, dist.data(), size, false);  // (m, n_cell)
      for (int64_t i = 0; i < m; ++i) {
        const int64_t q = probes[g + static_cast<size_t>(i)].second;
        const float qn = kernels::vec::dot(group.data() + i * d, group.data() + i * d, d);
        Heap& heap = heaps[static_cast<size_t>(q)];
        for (int64_t j = 0; j < size; ++j) {
          const std::pair<float, int64_t> item{std::max(0.0f, qn + row_norms[j] - 2 * dist(i, j)),
                                               row_ids[static_cast<size_t>(j)]};
          if (static_cast<int64_t>(heap.size()) < k) {
            heap.push_back(item);
            std::push_heap(heap.begin(), heap.end());
          } else if (item < heap.front()) {
            std::pop_heap(heap.begin(), heap.end());
            heap.back() = item;
            std::push_heap(heap.begin(), heap.end());
          }
        }
      }
    }
    g = end;
  }
  for (int64_t q = 0; q < n; ++q) {
    Heap& heap = heaps[static_cast<size_t>(q)];
    std::sort_heap(heap.begin(), heap.end());  // nearest first
    for (size_t j = 0; j < heap.size(); ++j) {
      distances[q * k + static_cast<int64_t>(j)] = heap[j].first;
      ids[q * k + static_cast<int64_t>(j)] = heap[j].second;
    }
  }
}

// The chosen nlist for a first add of n rows (see IndexOptions::nlist):
// 4 sqrt(n), FAISS's rule of thumb, capped so that k-means (on up to 256
// rows per cell) stays under a minute on one core.
constexpr int64_t kMaxAutoCells = 1024;
int64_t auto_nlist(int64_t n) {
  const auto four_root = static_cast<int64_t>(std::llround(4.0 * std::sqrt(static_cast<double>(n))));
  return std::max<int64_t>(1, std::min({four_root, n / kRowsPerCell, kMaxAutoCells}));
}

// A std::ostream as FAISS's writer.
struct StreamWriter : faiss::IOWriter {
  explicit StreamWriter(std::ostream& out) : out(out) {}
  size_t operator()(const void* ptr, size_t size, size_t nitems) override {
    out.write(static_cast<const char*>(ptr), static_cast<std::streamsize>(size * nitems));
    return out.good() ? nitems : 0;
  }
  std::ostream& out;
};

// At most `left` bytes of a std::istream as FAISS's reader.
struct StreamReader : faiss::IOReader {
  StreamReader(std::istream& in, uint64_t left) : in(in), left(left) {}
  size_t operator()(void* ptr, size_t size, size_t nitems) override {
    if (size == 0 || nitems == 0) return 0;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(nitems, left / size));
    in.read(static_cast<char*>(ptr), static_cast<std::streamsize>(n * size));
    const auto got = static_cast<size_t>(in.gcount());
    left -= got;
    return got / size;
  }
  std::istream& in;
  uint64_t left;
};

// FAISS's 4-byte type tags ("IxF2": a flat L2 index), as its serialisation stores them.
constexpr uint32_t fourcc(const char (&s)[5]) {
  return static_cast<uint32_t>(static_cast<unsigned char>(s[0])) |
         static_cast<uint32_t>(static_cast<unsigned char>(s[1])) << 8 |
         static_cast<uint32_t>(static_cast<unsigned char>(s[2])) << 16 |
         static_cast<uint32_t>(static_cast<unsigned char>(s[3])) << 24;
}

// A walk over faiss::write_index's bytes for the three kinds tapeformer
// writes (FAISS 1.7: IxF2 flat, IwFl ivf, IHNf hnsw), before
// faiss::read_index sees them. FAISS reads a vector as a count and then
// resizes to it: a forged count allocates (and zero-fills) whatever it says
// before the short read is noticed, so here every count is checked against
// the bytes left first, and the sizes that must agree (dimensions, cells,
// list sizes against the keys) are checked too. The stream is left where it
// started; nothing here allocates more than the file's own bytes.
class LayoutScan {
 public:
  LayoutScan(std::istream& in, uint64_t bytes, int64_t dim, const std::string& origin)
      : reader_{in, bytes, origin, "corrupt index"}, dim_(dim), origin_(origin) {}

  // The index of `kind` ("exact", "ivf", "hnsw"), to its last byte.
  void index(const std::string& kind) {
    if (kind == "exact") {
      flat("the keys");
    } else if (kind == "ivf") {
      ivf();
    } else {
      hnsw();
    }
    TAPEFORMER_CHECK(reader_.left == 0, origin_, ": corrupt index (", reader_.left,
                     " stray bytes after the FAISS index)");
  }

 private:
  void skip(uint64_t n) {
    // Callers checked n <= reader_.left.
    reader_.in.seekg(static_cast<std::streamoff>(n), std::ios::cur);
    TAPEFORMER_CHECK(reader_.in.good(), origin_, ": cannot read the index");
    reader_.left -= n;
  }
  // A FAISS vector's element count, refused when its elements would not fit
  // in the bytes left (so FAISS never allocates for them).
  uint64_t count(uint64_t element_bytes, const char* field) {
    const auto n = reader_.get<uint64_t>(field);
    TAPEFORMER_CHECK(n <= reader_.left / element_bytes, origin_, ": corrupt index (", field, ": a count of ", n,
                     " entries of ", element_bytes, " bytes, more than the ", reader_.left,
                     " bytes left in the file)");
    return n;
  }
  void tag(const char (&want)[5], const char* what) {
    const auto got = reader_.get<uint32_t>(what);
    if (got == fourcc(want)) return;
    std::string name(reinterpret_cast<const char*>(&got), 4);
    for (char& c : name)
      if (c < 32 || c > 126) c = '?';
    fail(origin_, ": corrupt index (FAISS type \"", name, "\" for ", what, ", expected \"", want, "\")");
  }
  // Index::d, ntotal, two unused fields, is_trained, metric: returns ntotal.
  int64_t header(const char* what) {
    const auto d = reader_.get<int32_t>("the index header");
    const auto ntotal = reader_.get<int64_t>("the index header");
    reader_.get<int64_t>("the index header");
    reader_.get<int64_t>("the index header");
    const auto trained = reader_.get<uint8_t>("the index header");
    const auto metric = reader_.get<int32_t>("the index header");
    TAPEFORMER_CHECK(d == dim_, origin_, ": corrupt index (", what, " has width ", d, ", the index ", dim_, ")");
    TAPEFORMER_CHECK(ntotal >= 0 && static_cast<uint64_t>(ntotal) <= reader_.left, origin_, ": corrupt index (", what,
                     " claims ", ntotal, " vectors for ", reader_.left, " bytes left in the file)");
    TAPEFORMER_CHECK(trained <= 1, origin_, ": corrupt index (", what, ": is_trained byte ", int{trained}, ")");
    TAPEFORMER_CHECK(metric == 1, origin_, ": corrupt index (", what, ": metric ", metric, ", not L2)");
    return ntotal;
  }
  // IndexFlatL2: the header, then its vectors' floats. Returns ntotal.
  int64_t flat(const char* what) {
    tag("IxF2", what);
    const int64_t ntotal = header(what);
    const uint64_t floats = count(4, what);
    TAPEFORMER_CHECK(floats % static_cast<uint64_t>(dim_) == 0 &&
                         floats / static_cast<uint64_t>(dim_) == static_cast<uint64_t>(ntotal),
                     origin_,
                     ": corrupt index (", what, " holds ", floats, " floats for ", ntotal, " vectors of width ", dim_,
                     ")");
    skip(floats * 4);
    return ntotal;
  }
  // IndexIVFFlat: the header, nlist, nprobe, the centroids (a flat index),
  // an empty direct map, then the cells ("ilar": sizes, then each cell's
  // keys and ids).
  void ivf() {
    tag("IwFl", "the ivf index");
    const int64_t ntotal = header("the ivf index");
    const auto nlist = reader_.get<uint64_t>("the ivf cell count");
    reader_.get<uint64_t>("the ivf nprobe");
    const int64_t centroids = flat("the ivf centroids");
    TAPEFORMER_CHECK(nlist >= 1 && nlist == static_cast<uint64_t>(centroids), origin_, ": corrupt index (", nlist,
                     " ivf cells with ", centroids, " centroids)");
    const auto map_kind = reader_.get<uint8_t>("the ivf direct map");
    const uint64_t map_entries = count(8, "the ivf direct map");
    TAPEFORMER_CHECK(map_kind == 0 && map_entries == 0, origin_, ": corrupt index (an ivf direct map of kind ",
                     int{map_kind}, " with ", map_entries, " entries; tapeformer writes none)");
    tag("ilar", "the ivf cells");
    const auto lists = reader_.get<uint64_t>("the ivf cells");
    const auto code_size = reader_.get<uint64_t>("the ivf cells");
    TAPEFORMER_CHECK(lists == nlist && code_size == 4 * static_cast<uint64_t>(dim_), origin_, ": corrupt index (",
                     lists, " ivf cells of ", code_size, " bytes per key, for ", nlist, " cells of width ", dim_, ")");
    std::vector<uint64_t> sizes(nlist);  // nlist centroids were in the file: bounded by its size
    const auto list_type = reader_.get<uint32_t>("the ivf cell sizes");
    if (list_type == fourcc("full")) {
      TAPEFORMER_CHECK(count(8, "the ivf cell sizes") == nlist, origin_,
                       ": corrupt index (ivf cell sizes for other than ", nlist, " cells)");
      for (uint64_t& n : sizes) n = reader_.get<uint64_t>("the ivf cell sizes");
    } else if (list_type == fourcc("sprs")) {
      const uint64_t n = count(8, "the ivf cell sizes");
      TAPEFORMER_CHECK(n % 2 == 0, origin_, ": corrupt index (an odd count ", n, " of sparse ivf cell sizes)");
      for (uint64_t i = 0; i < n; i += 2) {
        const auto cell = reader_.get<uint64_t>("the ivf cell sizes");
        const auto size = reader_.get<uint64_t>("the ivf cell sizes");
        TAPEFORMER_CHECK(cell < nlist, origin_, ": corrupt index (a size for ivf cell ", cell, " of ", nlist, ")");
        sizes[cell] = size;
      }
    } else {
      fail(origin_, ": corrupt index (unknown ivf cell layout ", list_type, ")");
    }
    uint64_t total = 0;
    for (uint64_t cell = 0; cell < nlist; ++cell) {
      const uint64_t n = sizes[cell];
      // Each key of a cell takes its code and its id (8 bytes).
      TAPEFORMER_CHECK(n <= reader_.left / (code_size + 8), origin_, ": corrupt index (ivf cell ", cell, " claims ", n,
                       " keys, more than the ", reader_.left, " bytes left in the file hold)");
      skip(n * (code_size + 8));
      total += n;
    }
    TAPEFORMER_CHECK(total == static_cast<uint64_t>(ntotal), origin_, ": corrupt index (the ivf cells hold ", total,
                     " keys, the index ", ntotal, ")");
  }
  // IndexHNSWFlat: the header, the graph (level probabilities, cumulative
  // links per level, levels, offsets, links, then five ints), its storage.
  void hnsw() {
    tag("IHNf", "the hnsw index");
    const int64_t ntotal = header("the hnsw index");
    TAPEFORMER_CHECK(ntotal <= INT32_MAX, origin_, ": corrupt index (", ntotal, " hnsw nodes)");
    skip(count(8, "the hnsw level probabilities") * 8);
    skip(count(4, "the hnsw links per level") * 4);
    skip(count(4, "the hnsw levels") * 4);
    skip(count(8, "the hnsw offsets") * 8);
    skip(count(4, "the hnsw links") * 4);
    for (int i = 0; i < 5; ++i) reader_.get<int32_t>("the hnsw parameters");
    const int64_t stored = flat("the hnsw storage");
    TAPEFORMER_CHECK(stored == ntotal, origin_, ": corrupt index (the hnsw storage holds ", stored, " keys, the graph ",
                     ntotal, ")");
  }

  BoundedReader reader_;  // the index's bytes, and how many are left
  int64_t dim_;
  const std::string& origin_;
};

// Every float of n keys (n, d) finite, and each key's squared norm within a
// float (beyond it, distances to it are inf or NaN): a forged key would
// never be found, or poison the mixture. Keys are named by their ids (by
// their rows where ids is null).
void check_keys(const uint8_t* codes, size_t n, int64_t d, const faiss::Index::idx_t* ids, const std::string& origin,
                const char* what) {
  const auto* x = reinterpret_cast<const float*>(codes);
  for (size_t i = 0; i < n; ++i) {
    double norm = 0;
    const int64_t id = ids != nullptr ? ids[i] : static_cast<int64_t>(i);
    for (int64_t c = 0; c < d; ++c) {
      const float v = x[i * static_cast<size_t>(d) + static_cast<size_t>(c)];
      TAPEFORMER_CHECK(std::isfinite(v), origin, ": ", what, " ", id, " has a non-finite value (", v, ") at ", c);
      norm += static_cast<double>(v) * v;
    }
    TAPEFORMER_CHECK(norm <= std::numeric_limits<float>::max(), origin, ": ", what, " ", id,
                     " is too large (squared norm ", norm, ")");
  }
}

void check_flat(const faiss::Index* index, int64_t dim, int64_t ntotal, const std::string& origin, const char* what) {
  const auto* flat = dynamic_cast<const faiss::IndexFlat*>(index);
  TAPEFORMER_CHECK(flat != nullptr && flat->metric_type == faiss::METRIC_L2 && flat->d == dim &&
                       flat->ntotal == ntotal && flat->code_size == 4 * static_cast<size_t>(dim) &&
                       flat->codes.size() == static_cast<size_t>(ntotal) * flat->code_size,
                   origin, ": corrupt index (", what, " is not ", ntotal, " L2 vectors of width ", dim, ")");
  check_keys(flat->codes.data(), static_cast<size_t>(ntotal), dim, nullptr, origin, what);
}

// The cells: as many as centroids, keys of the index's width, every id in
// [0, ntotal) once (the ids are the rows in the order added, which the
// datastore's values are indexed by).
void check_ivf(const faiss::IndexIVFFlat& ivf, int64_t dim, const IndexOptions& o, const std::string& origin) {
  TAPEFORMER_CHECK(ivf.nlist >= 1 && static_cast<int64_t>(ivf.nlist) == o.nlist, origin, ": corrupt index (",
                   ivf.nlist, " ivf cells, the options say ", o.nlist, ")");
  check_flat(ivf.quantizer, dim, static_cast<int64_t>(ivf.nlist), origin, "ivf centroid");
  TAPEFORMER_CHECK(ivf.direct_map.type == faiss::DirectMap::NoMap && ivf.direct_map.array.empty(), origin,
                   ": corrupt index (an ivf direct map)");
  const auto* lists = dynamic_cast<const faiss::ArrayInvertedLists*>(ivf.invlists);
  TAPEFORMER_CHECK(lists != nullptr && lists->nlist == ivf.nlist && lists->code_size == 4 * static_cast<size_t>(dim) &&
                       ivf.code_size == lists->code_size && lists->ids.size() == ivf.nlist &&
                       lists->codes.size() == ivf.nlist,
                   origin, ": corrupt index (the ivf cells are not ", ivf.nlist, " lists of width ", dim, ")");
  std::vector<bool> seen(static_cast<size_t>(ivf.ntotal));
  int64_t total = 0;
  for (size_t cell = 0; cell < ivf.nlist; ++cell) {
    const auto& ids = lists->ids[cell];
    TAPEFORMER_CHECK(lists->codes[cell].size() == ids.size() * lists->code_size, origin, ": corrupt index (ivf cell ",
                     cell, " holds ", ids.size(), " ids and ", lists->codes[cell].size(), " bytes of keys)");
    for (const faiss::Index::idx_t id : ids) {
      TAPEFORMER_CHECK(id >= 0 && id < ivf.ntotal && !seen[static_cast<size_t>(id)], origin,
                       ": corrupt index (ivf cell ", cell, " holds id ", id,
                       id >= 0 && id < ivf.ntotal ? " twice" : "", ", the ids are 0 to ", ivf.ntotal - 1, ")");
      seen[static_cast<size_t>(id)] = true;
    }
    total += static_cast<int64_t>(ids.size());
    check_keys(lists->codes[cell].data(), ids.size(), dim, ids.data(), origin, "key");
  }
  TAPEFORMER_CHECK(total == ivf.ntotal, origin, ": corrupt index (the ivf cells hold ", total, " keys, the index ",
                   ivf.ntotal, ")");
}

// The graph FAISS walks without checks: node i's links at level l are
// neighbors[offsets[i] + cum[l] .. offsets[i] + cum[l + 1]), for l below
// levels[i]; a link is -1 (none) or a node that has level l; the walk
// starts at entry_point, on level max_level.
void check_hnsw(const faiss::IndexHNSW& index, int64_t dim, const std::string& origin) {
  const faiss::HNSW& g = index.hnsw;
  const int64_t n = index.ntotal;
  const auto bad = [&](const auto&... what) { fail(origin, ": corrupt index (hnsw ", what..., ")"); };
  check_flat(index.storage, dim, n, origin, "key");
  const auto& cum = g.cum_nneighbor_per_level;
  if (cum.size() < 2 || cum[0] != 0 || g.assign_probas.size() != cum.size() - 1)
    bad(cum.size(), " cumulative link counts for ", g.assign_probas.size(), " levels");
  for (size_t l = 1; l < cum.size(); ++l)
    if (cum[l] <= cum[l - 1] || cum[l] > (1 << 20)) bad("link counts per level not increasing at level ", l - 1);
  for (const double p : g.assign_probas)
    if (!(p >= 0 && p <= 1)) bad("level probability ", p);
  const auto top = static_cast<int>(cum.size() - 1);  // levels a node may have
  if (static_cast<int64_t>(g.levels.size()) != n || static_cast<int64_t>(g.offsets.size()) != n + 1 ||
      g.offsets[0] != 0)
    bad(g.levels.size(), " levels and ", g.offsets.size(), " offsets for ", n, " nodes");
  int max_levels = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int levels = g.levels[static_cast<size_t>(i)];
    if (levels < 1 || levels > top) bad("node ", i, " has ", levels, " levels, not 1 to ", top);
    if (g.offsets[static_cast<size_t>(i + 1)] != g.offsets[static_cast<size_t>(i)] + static_cast<size_t>(cum[levels]))
      bad("node ", i, ": offset ", g.offsets[static_cast<size_t>(i + 1)], " after ", g.offsets[static_cast<size_t>(i)],
          " for ", levels, " levels");
    max_levels = std::max(max_levels, levels);
  }
  if (g.neighbors.size() != g.offsets.back()) bad(g.neighbors.size(), " links for offsets up to ", g.offsets.back());
  for (int64_t i = 0; i < n; ++i) {
    const size_t at = g.offsets[static_cast<size_t>(i)];
    for (int l = 0; l < g.levels[static_cast<size_t>(i)]; ++l)
      for (size_t j = at + static_cast<size_t>(cum[l]); j < at + static_cast<size_t>(cum[l + 1]); ++j) {
        const int to = g.neighbors[j];
        if (to < -1 || to >= n || (to >= 0 && g.levels[static_cast<size_t>(to)] <= l))
          bad("node ", i, " links to ", to, " on level ", l, " (", n, " nodes)");
      }
  }
  if (n == 0 ? g.entry_point != -1 || g.max_level != -1
             : g.entry_point < 0 || g.entry_point >= n || g.max_level != max_levels - 1 ||
                   g.levels[static_cast<size_t>(g.entry_point)] != max_levels)
    bad("entry point ", g.entry_point, " on level ", g.max_level, " (", n, " nodes, ", max_levels, " levels)");
  // search() keeps upper_beam candidates on the upper levels (0 writes past
  // its buffer); tapeformer builds with FAISS's 1. add() uses efConstruction.
  if (g.upper_beam != 1 || g.efConstruction < 1 || g.efConstruction > (1 << 20))
    bad("upper beam ", g.upper_beam, ", efConstruction ", g.efConstruction);
}

template <class T>
void put(std::ostream& out, T v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof v);
}
template <class T>
T get(std::istream& in, uint64_t& left, const std::string& origin) {
  T v{};
  TAPEFORMER_CHECK(left >= sizeof v && in.read(reinterpret_cast<char*>(&v), sizeof v), origin,
                   ": the index's options are cut short");
  left -= sizeof v;
  return v;
}

}  // namespace

void IndexOptions::validate() const {
  TAPEFORMER_CHECK(kind == "exact" || kind == "ivf" || kind == "hnsw", "index: unknown kind \"", kind,
                   "\" (known: exact, ivf, hnsw)");
  TAPEFORMER_CHECK(nlist >= 0, "index: nlist must be >= 0 (0: 4 sqrt(N)), got ", nlist);
  TAPEFORMER_CHECK(nprobe >= 1, "index: nprobe must be >= 1, got ", nprobe);
  TAPEFORMER_CHECK(nlist == 0 || nprobe <= nlist, "index: nprobe ", nprobe, " exceeds nlist ", nlist,
                   " (a query cannot scan more cells than there are)");
  TAPEFORMER_CHECK(hnsw_m >= 2 && hnsw_m <= 512, "index: hnsw M must be in [2, 512], got ", hnsw_m);
  TAPEFORMER_CHECK(ef_search >= 1 && ef_search <= (int64_t{1} << 20), "index: efSearch must be in [1, 2^20], got ",
                   ef_search);
}

std::string IndexOptions::describe() const {
  if (kind == "ivf")
    return "ivf (nlist " + (nlist > 0 ? std::to_string(nlist) : std::string("auto")) + ", nprobe " +
           std::to_string(nprobe) + ")";
  if (kind == "hnsw") return "hnsw (M " + std::to_string(hnsw_m) + ", efSearch " + std::to_string(ef_search) + ")";
  return kind;
}

VectorIndex::VectorIndex(int64_t dim, const IndexOptions& options) : dim_(dim), options_(options) {
  TAPEFORMER_CHECK(retrieval_blas_linked == 1, "index: the BLAS routines for FAISS are not linked");
  // Flat searches of any number of queries go through sgemm_, not
  // FAISS's one-float-at-a-time loop (see l2sqr).
  faiss::distance_compute_blas_threshold = 1;
  TAPEFORMER_CHECK(dim >= 1 && dim <= (int64_t{1} << 20), "index: dim must be in [1, 2^20], got ", dim);
  options_.validate();
  if (options_.kind != "ivf") build(0);  // ivf waits for its first rows to learn cells from
}

VectorIndex::VectorIndex(int64_t dim, const IndexOptions& options, std::unique_ptr<Faiss> index)
    : dim_(dim), options_(options), index_(std::move(index)) {}

VectorIndex::~VectorIndex() = default;
VectorIndex::VectorIndex(VectorIndex&&) noexcept = default;
VectorIndex& VectorIndex::operator=(VectorIndex&&) noexcept = default;

int64_t VectorIndex::size() const { return index_ ? index_->index->ntotal : 0; }

void VectorIndex::build(int64_t n_first) {
  auto f = std::make_unique<Faiss>();
  const int d = static_cast<int>(dim_);
  if (options_.kind == "exact") {
    f->index = std::make_unique<faiss::IndexFlatL2>(d);
  } else if (options_.kind == "hnsw") {
    auto h = std::make_unique<faiss::IndexHNSWFlat>(d, static_cast<int>(options_.hnsw_m));
    h->hnsw.efSearch = static_cast<int>(options_.ef_search);
    use_fast_storage(*h);
    f->index = std::move(h);
  } else {
    const int64_t nlist = options_.nlist > 0 ? options_.nlist : auto_nlist(n_first);
    const int64_t needed = nlist == 1 ? 1 : kRowsPerCell * nlist;
    TAPEFORMER_CHECK(n_first >= needed, "index: ivf with nlist ", nlist, " learns its cells from at least ",
                     needed, " rows (", kRowsPerCell, " per cell), but the first add has ", n_first,
                     ": use a smaller nlist or the exact index");
    TAPEFORMER_CHECK(options_.nprobe <= nlist, "index: nprobe ", options_.nprobe, " exceeds nlist ", nlist);
    auto ivf = std::make_unique<faiss::IndexIVFFlat>(new faiss::IndexFlatL2(d), static_cast<size_t>(d),
                                                     static_cast<size_t>(nlist));
    ivf->own_fields = true;  // it deletes its quantizer
    ivf->nprobe = static_cast<size_t>(options_.nprobe);
    ivf->cp.min_points_per_centroid = 1;  // checked above, without FAISS's stderr warning
    // k-means learns the cells from a sample of 64 rows per cell (FAISS: 256): many cells stay affordable.
    ivf->cp.max_points_per_centroid = 64;
    options_.nlist = nlist;
    f->index = std::move(ivf);
  }
  index_ = std::move(f);
}

void VectorIndex::add(const float* rows, int64_t n) {
  TAPEFORMER_CHECK(n >= 0, "index: add of ", n, " rows");
  if (n == 0) return;
  TAPEFORMER_CHECK(size() + n <= (int64_t{1} << 40), "index: ", size(), " + ", n, " rows exceed 2^40");
  // FAISS's OpenMP loops take the threads, unless called from inside a TBB region.
  OmpThreads threads(parallel::in_parallel_region() ? 1 : parallel::num_threads());
  if (!index_) {
    build(n);
    faiss_call("ivf training", [&] { index_->index->train(n, rows); });
  }
  faiss_call("add", [&] { index_->index->add(n, rows); });
}

void VectorIndex::add(const Tensor& rows) {
  TAPEFORMER_CHECK(rows.shape().rank() == 2 && rows.dim(1) == dim_, "index: rows must be (N, ", dim_, "), got ",
                   rows.shape());
  const Tensor c = rows.contiguous();
  add(c.data(), c.dim(0));
}

Neighbours VectorIndex::search(const float* queries, int64_t n, int64_t k) const {
  TAPEFORMER_CHECK(k >= 1 && k <= (int64_t{1} << 20), "index: k must be in [1, 2^20], got ", k);
  TAPEFORMER_CHECK(n >= 0, "index: search of ", n, " queries");
  Neighbours out;
  out.n = n;
  out.k = k;
  out.distances.assign(static_cast<size_t>(n * k), std::numeric_limits<float>::infinity());
  out.ids.assign(static_cast<size_t>(n * k), -1);
  if (n == 0 || size() == 0) return out;
  const faiss::Index& index = *index_->index;
  const auto* ivf = dynamic_cast<const faiss::IndexIVF*>(&index);
  // Blocks of queries: the exact kind and ivf's cell assignment compare a
  // block with the keys or centroids as one matrix product.
  const int64_t grain = options_.kind == "hnsw" ? 8 : options_.kind == "ivf" ? 128 : 32;
  parallel::parallel_for(n, grain, [&](int64_t q0, int64_t q1) {
    OmpThreads one(1);
    faiss_call("search", [&] {
      float* d = out.distances.data() + q0 * k;
      int64_t* i = out.ids.data() + q0 * k;
      if (ivf != nullptr)
        ivf_search(*ivf, queries + q0 * dim_, q1 - q0, k, d, i);
      else
        index.search(q1 - q0, queries + q0 * dim_, k, d, i);
    });
  });
  for (size_t i = 0; i < out.ids.size(); ++i)
    if (out.ids[i] < 0) out.distances[i] = std::numeric_limits<float>::infinity();
  return out;
}

Neighbours VectorIndex::search(const Tensor& queries, int64_t k) const {
  TAPEFORMER_CHECK(queries.shape().rank() == 2 && queries.dim(1) == dim_, "index: queries must be (Q, ", dim_,
                   "), got ", queries.shape());
  const Tensor c = queries.contiguous();
  return search(c.data(), c.dim(0), k);
}

void VectorIndex::set_search_options(int64_t nprobe, int64_t ef_search) {
  IndexOptions o = options_;
  o.nprobe = nprobe;
  o.ef_search = ef_search;
  o.validate();
  options_ = o;
  if (!index_) return;
  if (auto* ivf = dynamic_cast<faiss::IndexIVF*>(index_->index.get())) ivf->nprobe = static_cast<size_t>(nprobe);
  if (auto* h = dynamic_cast<faiss::IndexHNSW*>(index_->index.get())) h->hnsw.efSearch = static_cast<int>(ef_search);
}

// Layout: dim, kind (u64 length + bytes), nlist, nprobe, hnsw_m, ef_search
// (i64 each), a u8 saying whether a FAISS index follows (an ivf index
// before its first add has none), then faiss::write_index's bytes.
void VectorIndex::write(std::ostream& out) const {
  put<int64_t>(out, dim_);
  put<uint64_t>(out, options_.kind.size());
  out.write(options_.kind.data(), static_cast<std::streamsize>(options_.kind.size()));
  for (int64_t v : {options_.nlist, options_.nprobe, options_.hnsw_m, options_.ef_search}) put<int64_t>(out, v);
  put<uint8_t>(out, index_ ? 1 : 0);
  if (!index_) return;
  StreamWriter writer(out);
  try {
    faiss::write_index(index_->index.get(), &writer);
  } catch (const faiss::FaissException& e) {
    // A short write (a full disk, a file size limit) is the stream's failure, not FAISS's.
    const auto* sink = dynamic_cast<const FileSink*>(out.rdbuf());
    if (!out.good()) fail("index: write failed: ", sink != nullptr && sink->error() != 0 ? std::strerror(sink->error())
                                                                                          : "the stream failed");
    fail("index: write: ", e.what());
  }
}

VectorIndex VectorIndex::read(std::istream& in, uint64_t bytes, const std::string& origin) {
  uint64_t left = bytes;
  const auto dim = get<int64_t>(in, left, origin);
  const auto kind_bytes = get<uint64_t>(in, left, origin);
  TAPEFORMER_CHECK(kind_bytes <= 16 && kind_bytes <= left, origin, ": an index kind of ", kind_bytes, " bytes");
  IndexOptions o;
  o.kind.resize(kind_bytes);
  in.read(o.kind.data(), static_cast<std::streamsize>(kind_bytes));
  left -= kind_bytes;
  o.nlist = get<int64_t>(in, left, origin);
  o.nprobe = get<int64_t>(in, left, origin);
  o.hnsw_m = get<int64_t>(in, left, origin);
  o.ef_search = get<int64_t>(in, left, origin);
  const auto has_index = get<uint8_t>(in, left, origin);
  TAPEFORMER_CHECK(dim >= 1 && dim <= (int64_t{1} << 20), origin, ": an index of dim ", dim);
  try {
    o.validate();
  } catch (const Error& e) {
    fail(origin, ": ", e.what());
  }
  if (has_index == 0) {
    TAPEFORMER_CHECK(o.kind == "ivf" && left == 0, origin, ": an index without its FAISS part");
    return VectorIndex(dim, o);
  }
  // Sizes first (nothing allocated), then FAISS's decoding, then what the
  // decoded structure must hold before anything searches it.
  const std::streampos start = in.tellg();
  TAPEFORMER_CHECK(start != std::streampos(-1), origin, ": cannot read the index");
  LayoutScan(in, left, dim, origin).index(o.kind);
  in.clear();
  in.seekg(start);
  TAPEFORMER_CHECK(in.good(), origin, ": cannot read the index");
  StreamReader reader(in, left);
  std::unique_ptr<faiss::Index> index;
  try {
    index.reset(faiss::read_index(&reader));
  } catch (const faiss::FaissException& e) {
    fail(origin, ": cannot decode the FAISS index (", e.what(), ")");
  } catch (const std::bad_alloc&) {  // the scan above bounds every size; this is a last line
    fail(origin, ": corrupt index (a size field larger than the file)");
  } catch (const std::length_error&) {
    fail(origin, ": corrupt index (a size field larger than the file)");
  }
  TAPEFORMER_CHECK(reader.left == 0, origin, ": ", reader.left, " stray bytes after the FAISS index");
  const bool kind_ok = o.kind == "exact"  ? dynamic_cast<faiss::IndexFlatL2*>(index.get()) != nullptr
                       : o.kind == "ivf" ? dynamic_cast<faiss::IndexIVFFlat*>(index.get()) != nullptr
                                         : dynamic_cast<faiss::IndexHNSWFlat*>(index.get()) != nullptr;
  TAPEFORMER_CHECK(kind_ok && index->d == dim, origin, ": the FAISS index is not a ", o.kind, " index of dim ", dim);
  TAPEFORMER_CHECK(index->metric_type == faiss::METRIC_L2 && index->ntotal >= 0, origin,
                   ": corrupt index (metric ", static_cast<int>(index->metric_type), ", ", index->ntotal, " keys)");
  if (o.kind == "exact") check_flat(index.get(), dim, index->ntotal, origin, "key");
  if (auto* ivf = dynamic_cast<faiss::IndexIVFFlat*>(index.get())) check_ivf(*ivf, dim, o, origin);
  if (auto* h = dynamic_cast<faiss::IndexHNSW*>(index.get())) {
    check_hnsw(*h, dim, origin);
    faiss_call("read", [&] { use_fast_storage(*h); });
  }
  auto f = std::make_unique<Faiss>();
  f->index = std::move(index);
  VectorIndex v(dim, o, std::move(f));
  v.set_search_options(o.nprobe, o.ef_search);
  return v;
}

namespace {
constexpr char kIndexMagic[9] = "TFVINDX1";
}

void VectorIndex::save(const std::string& path) const {
  write_checked_file(path, kIndexMagic, 1, [&](std::ostream& out) { write(out); });
}

VectorIndex VectorIndex::load(const std::string& path) {
  CheckedFile f = open_checked_file(path, kIndexMagic, 1, "vector index");
  return read(*f.in, f.length, "vector index '" + path + "'");
}

}  // namespace tapeformer
