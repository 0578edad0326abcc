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

  // A group that spans nodes (hier): `node` = the ranks of this node (node-local, shm possible),
  // `leaders` = the lowest rank of every node (null on the other ranks); nodes = their count.
  std::unique_ptr<MpiContext> node, leaders;
  int nodes = 1;

  ShmSegment& shm_segment();   // collective on first use
  ThreadPool& thread_pool();
  // Frees the shm window and the communicators (collective, children first); idempotent.
  void release();
  ~MpiContext() { release(); }
};

// MPI datatype of an element type (bf16/fp16 as MPI_UINT16_T: moved, never reduced by MPI).
MPI_Datatype mpi_datatype(DType t);
// Throws when n does not fit MPI's int counts.
int mpi_count(std::size_t n, const char* what);

void run_library(MpiContext& ctx, const Request& req);
void run_ring(MpiContext& ctx, const Request& req);
void run_shm(MpiContext& ctx, const Request& req);
// All-reduce over ctx.node (shm), ctx.leaders (library), ctx.node (shm broadcast); needs node set.
void run_hier(MpiContext& ctx, const Request& req);

}  // namespace lmscale::comm::detail
