#pragma once
// The node-local shared-memory staging area of the shm algorithms: every rank of the communicator
// owns two buffers of `buffer_bytes` (double buffering) in one MPI_Win_allocate_shared window and
// can read and write every other rank's buffers directly.
//
// Reuse rule that makes one sync per phase enough: consecutive chunks alternate buffers, so a rank
// writes a buffer only after the sync of the previous chunk, which every rank reaches only after
// it has finished reading that buffer's previous contents.
#include <mpi.h>

#include <cstddef>
#include <vector>

namespace lmscale::comm::detail {

class ShmSegment {
 public:
  // Collective over `comm` (all ranks on one node).
  ShmSegment(MPI_Comm comm, std::size_t buffer_bytes);
  ~ShmSegment();   // collective (MPI_Win_free); skipped while an exception unwinds (core/error.h)
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  std::size_t buffer_bytes() const { return buffer_bytes_; }
  // Buffer `which` (0 or 1) of rank `r`.
  char* slot(int r, int which) const { return bases_[static_cast<std::size_t>(r)] + static_cast<std::size_t>(which) * buffer_bytes_; }
  // The buffer the next chunk uses (alternates 0, 1, 0, ... on every rank in step).
  int next_buffer() { return (turn_++) & 1; }
  // Makes every rank's writes so far visible to all and waits for all ranks.
  void sync();

 private:
  MPI_Comm comm_;
  MPI_Win win_ = MPI_WIN_NULL;
  int rank_ = 0;
  std::size_t buffer_bytes_;
  std::vector<char*> bases_;
  unsigned turn_ = 0;
};

}  // namespace lmscale::comm::detail
