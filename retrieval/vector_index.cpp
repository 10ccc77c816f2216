#include "tapeformer/retrieval/vector_index.h"

#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIVFFlat.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/DistanceComputer.h>
#include <faiss/impl/io.h>
#include <faiss/index_io.h>
#include <faiss/invlists/InvertedLists.h>
#include <faiss/utils/distances.h>
#include <omp.h>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <istream>
#include <limits>
#include <ostream>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"
#include "tapeformer/core/parallel.h"

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
float l2sqr(const float* a, const float* b, int64_t d) {
  using Vec = Eigen::Map<const Eigen::VectorXf>;
  return (Vec(a, d) - Vec(b, d)).squaredNorm();
}

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
      row_norms.noalias() = rows.rowwise().squaredNorm();
      dist.noalias() = group * rows.transpose();  // (m, n_cell)
      for (int64_t i = 0; i < m; ++i) {
        const int64_t q = probes[g + static_cast<size_t>(i)].second;
        const float qn = group.row(i).squaredNorm();
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
  faiss_call("write", [&] { faiss::write_index(index_->index.get(), &writer); });
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
  StreamReader reader(in, left);
  std::unique_ptr<faiss::Index> index;
  try {
    index.reset(faiss::read_index(&reader));
  } catch (const faiss::FaissException& e) {
    fail(origin, ": cannot decode the FAISS index (", e.what(), ")");
  }
  TAPEFORMER_CHECK(reader.left == 0, origin, ": ", reader.left, " stray bytes after the FAISS index");
  const bool kind_ok = o.kind == "exact"  ? dynamic_cast<faiss::IndexFlatL2*>(index.get()) != nullptr
                       : o.kind == "ivf" ? dynamic_cast<faiss::IndexIVFFlat*>(index.get()) != nullptr
                                         : dynamic_cast<faiss::IndexHNSWFlat*>(index.get()) != nullptr;
  TAPEFORMER_CHECK(kind_ok && index->d == dim, origin, ": the FAISS index is not a ", o.kind, " index of dim ", dim);
  if (auto* h = dynamic_cast<faiss::IndexHNSW*>(index.get())) faiss_call("read", [&] { use_fast_storage(*h); });
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
