#include "mpi_context.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <new>
#include <sched.h>
#include <thread>

#include "lmscale/core/error.h"

namespace lmscale::comm::detail {

ScratchBuffer::~ScratchBuffer() {
  if (ptr_) ::operator delete(ptr_, std::align_val_t{64});
}

void* ScratchBuffer::get(std::size_t bytes) {
  if (bytes > bytes_) {
    if (ptr_) ::operator delete(ptr_, std::align_val_t{64});
    ptr_ = nullptr;
    bytes_ = 0;
    ptr_ = ::operator new(bytes, std::align_val_t{64});
    bytes_ = bytes;
  }
  return ptr_;
}

ShmSegment& MpiContext::shm_segment() {
  if (!shm) shm = std::make_unique<ShmSegment>(comm, options.shm_chunk_bytes);
  return *shm;
}

void MpiContext::release() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Freeing communicators and windows is collective: not while an exception unwinds (core/error.h).
  if (unwinding()) return;
  // Children first: their shm windows live on their own communicators.
  node.reset();
  leaders.reset();
  shm.reset();
  pool.reset();
  if (ring != MPI_COMM_NULL) MPI_Comm_free(&ring);
  if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

ThreadPool& MpiContext::thread_pool() {
  if (!pool) {
    int threads = options.shm_threads;
    if (threads <= 0) {
      // Tuning without a deck key: LMSCALE_SHM_THREADS overrides the automatic choice.
      if (const char* env = std::getenv("LMSCALE_SHM_THREADS")) threads = std::atoi(env);
    }
    if (threads <= 0) {
      // The cores this process may run on: all of them when unbound (then shared by the ranks on
      // the node), or its own set when the launcher bound it (Open MPI binds each of <= 2 ranks
      // to one core by default: then one thread, since more would only contend).
      const int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      int allowed = all;
      cpu_set_t set;
      if (sched_getaffinity(0, sizeof(set), &set) == 0) allowed = std::max(1, CPU_COUNT(&set));
      threads = std::clamp(allowed >= all ? allowed / std::max(1, size) : allowed, 1, 8);
    }
    pool = std::make_unique<ThreadPool>(threads);
  }
  return *pool;
}

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::bf16: case DType::f16: return MPI_UINT16_T;
    case DType::u8: case DType::e4m3: case DType::e5m2: return MPI_UINT8_T;   // moved, never reduced
    default: throw Error(fmt::format("mpi backend: dtype {} not supported", dtype_name(t)));
  }
}

int mpi_count(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw Error(fmt::format("{}: {} elements exceed MPI's int count limit; split the buffer", what, n));
  return static_cast<int>(n);
}

}  // namespace lmscale::comm::detail
