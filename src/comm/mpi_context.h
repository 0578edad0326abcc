#pragma once
// What the algorithms of the mpi backend share (used only on the communication thread): the
// duplicated communicators, scratch buffers, and the lazily made shared-memory segment and pool.
#include <mpi.h>

#include <cstddef>
#include <memory>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/mpi_communicator.h"
#include "shm_segment.h"
#include "thread_pool.h"

namespace lmscale::comm::detail {

// A grow-only, 64-byte aligned host buffer (contents not kept when it grows).
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  void* get(std::size_t bytes);

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

struct MpiContext {
  MPI_Comm comm = MPI_COMM_NULL;   // collectives, user send/recv, check mode, shm syncs
  MPI_Comm ring = MPI_COMM_NULL;   // the ring algorithm's point-to-point messages
  int rank = 0;
  int size = 1;
  bool node_local = false;
  MpiOptions options;
  ScratchBuffer scratch_a, scratch_b;
  std::unique_ptr<ShmSegment> shm;
  std::unique_ptr<ThreadPool> pool;

  ShmSegment& shm_segment();   // collective on first use
  ThreadPool& thread_pool();
};

// MPI datatype of an element type (bf16/fp16 as MPI_UINT16_T: moved, never reduced by MPI).
MPI_Datatype mpi_datatype(DType t);
// Throws when n does not fit MPI's int counts.
int mpi_count(std::size_t n, const char* what);

void run_library(MpiContext& ctx, const Request& req);
void run_ring(MpiContext& ctx, const Request& req);
void run_shm(MpiContext& ctx, const Request& req);

}  // namespace lmscale::comm::detail
