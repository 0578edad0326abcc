#pragma once
// Vocabulary of the communication layer: reduction operators, algorithms, backends, and the
// per-call options every collective takes (docs/collectives.md).
#include <cstdint>
#include <optional>
#include <string_view>

#include "lmscale/core/dtype.h"

namespace lmscale::comm {

// sum; avg = sum then divide by the group size (floats: in the accumulation precision, rounded
// once; ints: C++ integer division, truncating toward zero); max.
enum class ReduceOp : std::uint8_t { sum, avg, max };
const char* reduce_op_name(ReduceOp op);   // "sum", "avg", "max"
ReduceOp parse_reduce_op(std::string_view name);

// How a collective is carried out.
//  library: the library's own collective (MPI_Allreduce, ncclAllReduce, ...)
//  ring:    the textbook ring over point-to-point messages (mpi backend): reduce-scatter then
//           all-gather over `size` chunks
//  shm:     node-local shared memory with several copy/reduce threads per rank (mpi backend,
//           all ranks of the communicator on one node)
//  hier:    all-reduce over several nodes (mpi backend): shm inside each node, then the library's
//           all-reduce between one leader per node (the network), then a shm broadcast inside
//           each node; other collectives use library
//  automatic: shm when every rank is on one node, hier when the group spans nodes and some node
//           holds several of its ranks (all-reduce only), each for messages of at least
//           shm_min_bytes; otherwise library
enum class Algo : std::uint8_t { automatic, library, ring, shm, hier };
const char* algo_name(Algo a);   // "auto", "library", "ring", "shm", "hier"

enum class Backend : std::uint8_t { mpi, nccl };
const char* backend_name(Backend b);   // "mpi", "nccl"

// Element types a communicator moves and reduces: fp32, fp64, bf16, fp16, int32, int64.
bool is_comm_dtype(DType t);
// Byte types it moves but never reduces (all_gather, broadcast, send/recv, all_to_all): uint8 and
// the FP8 formats (fsdp's FP8 weight gathers, docs/parallel.md). A reduction of one is refused.
bool is_comm_byte_dtype(DType t);

// Options of one call. async=false waits before returning (Work::wait semantics of the backend);
// algo overrides the communicator's default algorithm for this call.
struct CallOptions {
  bool async = false;
  std::optional<Algo> algo;
};
inline CallOptions async_call() { return CallOptions{true, std::nullopt}; }

}  // namespace lmscale::comm
