#pragma once
// The `nccl` backend, for device buffers (implementation: src/comm/cuda/nccl_communicator.cpp,
// built only with CUDA). This header has no CUDA types so that any layer can include it.
//
// - Rendezvous: rank 0 of `comm` makes the ncclUniqueId and broadcasts it over MPI; every rank
//   calls ncclCommInitRankConfig on its GPU. split() uses ncclCommSplit (and MPI_Comm_split for
//   the matching host group used by rendezvous, barrier and check mode).
// - Streams: the communicator owns a communication stream. Each call records an event on the
//   compute stream (set_compute_stream; default the legacy default stream), makes the
//   communication stream wait for it, launches the NCCL operation there and records a completion
//   event. Work::wait() makes the compute stream wait for that event (no host block);
//   Work::synchronize() blocks the host, polling ncclCommGetAsyncError so a failed peer raises an
//   Error instead of hanging.
// - Uneven forms: reduce_scatter_v = one ncclReduce per block (root = block owner), all_gather_v
//   = one ncclBroadcast per block, each set inside ncclGroupStart/End.
// - avg uses ncclAvg: floats are pre-multiplied by 1/size (exact when size is a power of two,
//   otherwise within an ulp of sum/size), ints are summed then divided. bf16/fp16 partial sums are
//   rounded to 16 bits at each ring step (NCCL's behaviour); results are exact whenever they fit.
// - algo: only library (auto means library); ring/shm are UsageErrors.
// - Errors name the operation and the rank with ncclGetErrorString and ncclGetLastError; after an
//   error the destructor aborts the NCCL communicator (ncclCommAbort) instead of destroying it.
// - NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set in the environment when unset.
#include <mpi.h>

#include <memory>
#include <string>

#include "lmscale/comm/communicator.h"

namespace lmscale::comm {

struct NcclOptions {
  bool check = false;
  // parallel.comm_sms: at most this many CTAs (SMs) for NCCL's kernels (ncclConfig_t maxCTAs, also
  // for the communicators split from this one); 0 = NCCL's choice.
  int max_ctas = 0;
};

// Collective over `comm`; each rank passes its CUDA device index (its local rank). Throws
// UsageError when lmscale was built without CUDA.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int cuda_device, NcclOptions options = {});

// NCCL's version as "2.28.3" (runtime library), or "" without CUDA.
std::string nccl_version();

}  // namespace lmscale::comm
