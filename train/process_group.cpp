// ProcessGroup over MPI (TAPEFORMER_MPI), or the refusal without it.
#include "tapeformer/train/process_group.h"

#include <cstdlib>
#include <mutex>

#include "tapeformer/core/error.h"
#include "tapeformer/core/numbers.h"
#include "tapeformer/core/profile.h"

#ifdef TAPEFORMER_HAVE_MPI
#include <mpi.h>
#endif

namespace tapeformer {
namespace {

// The process count mpirun (Open MPI), or another PMI launcher, started this
// process with; 0 when no launcher did.
int launcher_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"}) {
    if (const char* v = std::getenv(var); v && *v) return parse_number<int>(v, var);
  }
  return 0;
}

#ifdef TAPEFORMER_HAVE_MPI

void check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(code, text, &n);
  fail("MPI ", what, " failed: ", std::string(text, static_cast<size_t>(n)));
}

// MPI counts and displacements are ints: byte counts past 2 GiB per rank are refused.
std::vector<int> to_ints(const std::vector<int64_t>& bytes, const char* what) {
  std::vector<int> out;
  for (int64_t b : bytes) {
    TAPEFORMER_CHECK(b >= 0 && b <= INT32_MAX, "MPI ", what, ": ", b, " bytes in one message (more than 2 GiB)");
    out.push_back(static_cast<int>(b));
  }
  return out;
}
std::vector<int> displacements(const std::vector<int>& counts, const char* what) {
  std::vector<int> d(counts.size(), 0);
  int64_t at = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    TAPEFORMER_CHECK(at <= INT32_MAX, "MPI ", what, ": more than 2 GiB in one exchange");
    d[i] = static_cast<int>(at);
    at += counts[i];
  }
  return d;
}

// One MPI-3 shared window over the ranks of a machine, locked for passive
// access for its lifetime; sync() = MPI_Win_sync, barrier, MPI_Win_sync.
class MpiSharedFloats : public ProcessGroup::SharedFloats {
 public:
  MpiSharedFloats(MPI_Comm node, int64_t floats, int ranks) : node_(node) {
    float* base = nullptr;
    check(MPI_Win_allocate_shared(static_cast<MPI_Aint>(floats * static_cast<int64_t>(sizeof(float))),
                                  static_cast<int>(sizeof(float)), MPI_INFO_NULL, node_, &base, &win_),
          "shared window");
    check(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), "shared window lock");
    for (int r = 0; r < ranks; ++r) {
      MPI_Aint bytes = 0;
      int unit = 0;
      float* p = nullptr;
      check(MPI_Win_shared_query(win_, r, &bytes, &unit, &p), "shared window query");
      segments_.push_back(p);
    }
  }
  ~MpiSharedFloats() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Win_unlock_all(win_);
    MPI_Win_free(&win_);
    MPI_Comm_free(&node_);
  }
  float* segment(int rank) override { return segments_[static_cast<size_t>(rank)]; }
  void sync() override {
    MPI_Win_sync(win_);
    check(MPI_Barrier(node_), "barrier");
    MPI_Win_sync(win_);
  }

 private:
  MPI_Comm node_;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<float*> segments_;
};

class MpiGroup : public ProcessGroup {
 public:
  MpiGroup() {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "init");
    // Errors come back as codes (turned into Errors) instead of aborting here.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    MPI_Get_library_version(version, &n);
    library_ = std::string(version, static_cast<size_t>(n));
    library_ = library_.substr(0, library_.find(','));  // "Open MPI v4.1.4"
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return library_ + ", " + std::to_string(size_) + " processes"; }

  void allgather(const void* send, int64_t send_bytes, void* recv, const std::vector<int64_t>& recv_bytes) override {
    TAPEFORMER_CHECK(static_cast<int>(recv_bytes.size()) == size_ && recv_bytes[rank_] == send_bytes,
                     "allgather: receive counts do not match this rank's send");
    const std::vector<int> counts = to_ints(recv_bytes, "allgather");
    const std::vector<int> at = displacements(counts, "allgather");
    check(MPI_Allgatherv(send, counts[rank_], MPI_BYTE, recv, counts.data(), at.data(), MPI_BYTE, MPI_COMM_WORLD),
          "allgather");
    profile::add_bytes_sent(send_bytes * (size_ - 1));
  }

  void alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                const std::vector<int64_t>& recv_bytes) override {
    TAPEFORMER_CHECK(static_cast<int>(send_bytes.size()) == size_ && static_cast<int>(recv_bytes.size()) == size_,
                     "alltoall: a count per rank is needed");
    const std::vector<int> sc = to_ints(send_bytes, "alltoall"), rc = to_ints(recv_bytes, "alltoall");
    const std::vector<int> sd = displacements(sc, "alltoall"), rd = displacements(rc, "alltoall");
    check(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, MPI_COMM_WORLD),
          "alltoall");
    int64_t sent = 0;
    for (int q = 0; q < size_; ++q)
      if (q != rank_) sent += send_bytes[static_cast<size_t>(q)];
    profile::add_bytes_sent(sent);
  }

  int64_t max(int64_t value) override {
    int64_t out = 0;
    check(MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD), "allreduce");
    return out;
  }

  std::unique_ptr<SharedFloats> share_floats(const std::vector<int64_t>& floats) override {
    TAPEFORMER_CHECK(static_cast<int>(floats.size()) == size_, "share_floats: a count per rank is needed");
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "split_type");
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    if (std::getenv("TAPEFORMER_NO_SHARED_MEMORY") != nullptr) node_size = 0;  // the collectives, for comparison
    if (MPI_Allreduce(MPI_IN_PLACE, &node_size, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS ||
        node_size != size_) {  // ranks on several machines: no memory they all share
      MPI_Comm_free(&node);
      return nullptr;
    }
    return std::make_unique<MpiSharedFloats>(node, floats[static_cast<size_t>(rank_)], size_);
  }

 private:
  int rank_ = 0, size_ = 1;
  std::string library_;
};

#endif  // TAPEFORMER_HAVE_MPI

}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::world() {
  static std::once_flag once;
  static std::shared_ptr<ProcessGroup> group;
  static std::string refusal;
  std::call_once(once, [] {
    const int n = launcher_size();
#ifdef TAPEFORMER_HAVE_MPI
    if (n > 0) {
      auto g = std::make_shared<MpiGroup>();
      if (g->size() > 1) group = g;
    }
#else
    if (n > 1)
      refusal = "this tapeformer was built without MPI (TAPEFORMER_MPI=OFF, or libopenmpi-dev was missing), but "
                "mpirun started " + std::to_string(n) + " processes: each would train alone. Rebuild with "
                "libopenmpi-dev installed, or run one process";
#endif
  });
  TAPEFORMER_CHECK(refusal.empty(), refusal);
  return group;
}

void ProcessGroup::abort_job(int exit_code) {
#ifdef TAPEFORMER_HAVE_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
#else
  (void)exit_code;
#endif
}

}  // namespace tapeformer
