#include "lmscale/comm/types.h"

#include <string>

#include "lmscale/core/error.h"

namespace lmscale::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "avg" || name == "mean") return ReduceOp::avg;
  if (name == "max") return ReduceOp::max;
  throw UsageError(fmt::format("unknown reduce op '{}' (use sum, avg or max)", name));
}

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::automatic: return "auto";
    case Algo::library: return "library";
    case Algo::ring: return "ring";
    case Algo::shm: return "shm";
    case Algo::hier: return "hier";
  }
  return "?";
}

const char* backend_name(Backend b) { return b == Backend::mpi ? "mpi" : "nccl"; }

bool is_comm_dtype(DType t) {
  switch (t) {
    case DType::f32: case DType::f64: case DType::bf16: case DType::f16: case DType::i32: case DType::i64:
      return true;
    default:
      return false;
  }
}

bool is_comm_byte_dtype(DType t) { return t == DType::u8 || t == DType::e4m3 || t == DType::e5m2; }

}  // namespace lmscale::comm
