#include "shm_segment.h"

#include "lmscale/core/error.h"
#include "mpi_check.h"

namespace lmscale::comm::detail {

ShmSegment::ShmSegment(MPI_Comm comm, std::size_t buffer_bytes) : comm_(comm), buffer_bytes_(buffer_bytes) {
  int size = 0;
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size);
  MPI_Info info;
  MPI_Info_create(&info);
  // Each rank's part on its own pages (first touched by its owner, so NUMA-local to it).
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  char* base = nullptr;
  const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(2 * buffer_bytes), 1, info, comm, &base, &win_);
  MPI_Info_free(&info);
  LMSCALE_MPI_CHECK(rc, rank_);
  bases_.resize(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    MPI_Aint bytes = 0;
    int disp = 0;
    void* p = nullptr;
    LMSCALE_MPI_CHECK(MPI_Win_shared_query(win_, r, &bytes, &disp, &p), rank_);
    bases_[static_cast<std::size_t>(r)] = static_cast<char*>(p);
  }
  // A passive-target epoch for the window's lifetime, so MPI_Win_sync may order the loads/stores.
  LMSCALE_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_), rank_);
}

ShmSegment::~ShmSegment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || win_ == MPI_WIN_NULL) return;
  // MPI_Win_free synchronises the window's ranks: never while an exception unwinds (the peer may
  // be waiting in another collective, issue 36); the failing rank aborts the job instead.
  if (unwinding()) return;
  MPI_Win_unlock_all(win_);
  MPI_Win_free(&win_);
}

void ShmSegment::sync() {
  LMSCALE_MPI_CHECK(MPI_Win_sync(win_), rank_);
  LMSCALE_MPI_CHECK(MPI_Barrier(comm_), rank_);
  LMSCALE_MPI_CHECK(MPI_Win_sync(win_), rank_);
}

}  // namespace lmscale::comm::detail
