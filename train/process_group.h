// The processes of a distributed run: `mpirun -np N tapeformer train ...`.
//
//   std::shared_ptr<ProcessGroup> g = ProcessGroup::world();   // null: one process
//   if (g) std::printf("rank %d of %d\n", g->rank(), g->size());
//
// Each process (rank) runs its shards of every batch; DataParallel exchanges
// their gradients through the group's collectives and sums them in a fixed
// order, so a run's numbers depend on the total shard count only (see
// train/data_parallel.h). The transport is MPI (OpenMPI, Debian's
// libopenmpi-dev): the engine HPC clusters already run, with its launchers,
// hostfiles and fast interconnects, instead of a home-made one. Built
// without it (TAPEFORMER_MPI=OFF), world() is always null, and a program
// started by mpirun with more than one process refuses to run rather than
// have every process train alone.
//
// Every collective must be called by every rank in the same order; all are
// blocking. Calls come from one thread (the trainer's); the kernels' threads
// never communicate.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tapeformer {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "Open MPI v4.1.4, 2 processes", for logs.
  virtual std::string describe() const = 0;

  // recv = the concatenation of every rank's `send` in rank order; rank r
  // sends recv_bytes[r] bytes (send_bytes == recv_bytes[rank()]).
  virtual void allgather(const void* send, int64_t send_bytes, void* recv,
                         const std::vector<int64_t>& recv_bytes) = 0;
  // Personalised exchange: this rank sends send_bytes[q] bytes (consecutive
  // in `send`) to rank q and receives recv_bytes[r] bytes from rank r
  // (consecutive in `recv`, in rank order).
  virtual void alltoall(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                        const std::vector<int64_t>& recv_bytes) = 0;
  // The largest of every rank's value.
  virtual int64_t max(int64_t value) = 0;

  // Memory every rank reads and writes directly, when all ranks run on one
  // machine (MPI-3 shared windows): rank r's segment holds floats[r] floats,
  // the segments consecutive in rank order. sync() is a barrier that also
  // orders memory: what any rank wrote before it, every rank sees after it.
  class SharedFloats {
   public:
    virtual ~SharedFloats() = default;
    virtual float* segment(int rank) = 0;
    virtual void sync() = 0;
  };
  // Collective (every rank calls it with the same counts); null when the
  // ranks span machines or memory cannot be shared: use the collectives.
  virtual std::unique_ptr<SharedFloats> share_floats(const std::vector<int64_t>& floats) {
    (void)floats;
    return nullptr;
  }

  // The running job's group: null when it is one process (no mpirun, or
  // mpirun -np 1). The first call initialises MPI; it is finalised at exit.
  static std::shared_ptr<ProcessGroup> world();
  // Ends the whole job now (MPI_Abort), after this rank printed its error:
  // the other ranks may be waiting in a collective that will never complete.
  // Does nothing without MPI.
  static void abort_job(int exit_code);
};

// Typed helpers over the byte collectives.
// Every rank's `mine` (the same count on every rank), concatenated in rank order.
template <class T>
std::vector<T> allgather_equal(ProcessGroup& g, const std::vector<T>& mine) {
  std::vector<T> all(mine.size() * static_cast<size_t>(g.size()));
  const int64_t bytes = static_cast<int64_t>(mine.size() * sizeof(T));
  g.allgather(mine.data(), bytes, all.data(), std::vector<int64_t>(static_cast<size_t>(g.size()), bytes));
  return all;
}

}  // namespace tapeformer
