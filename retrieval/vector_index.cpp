#include "tapeformer/retrieval/vector_index.h"

#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIVFFlat.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/io.h>
#include <faiss/index_io.h>
#include <omp.h>

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
  // The exact kind compares a block of at least 20 queries with BLAS
  // (faiss::distance_compute_blas_threshold); the others walk per query.
  const int64_t grain = options_.kind == "exact" ? 32 : 8;
  parallel::parallel_for(n, grain, [&](int64_t q0, int64_t q1) {
    OmpThreads one(1);
    faiss_call("search", [&] {
      index.search(q1 - q0, queries + q0 * dim_, k, out.distances.data() + q0 * k, out.ids.data() + q0 * k);
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
