#include "lmscale/parallel/tensor_parallel.h"

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/parallel/sliced_parameters.h"

namespace lmscale::parallel {

TensorParallel::TensorParallel(comm::Communicator& device, comm::Communicator& host, bool sequence_parallel)
    : device_(device), host_(host) {
  LMSCALE_CHECK(device.size() == host.size() && device.rank() == host.rank(),
                "tensor parallel: device ({} of {}) and host ({} of {}) communicators differ", device.rank(),
                device.size(), host.rank(), host.size());
  split_.degree = device.size();
  split_.rank = device.rank();
  split_.sequence_parallel = sequence_parallel;
  // Each call returns once the result is usable by the next op on the compute stream: mpi blocks
  // until done; nccl makes the compute stream wait for the communication stream (no host wait).
  // The model calls them in the same order on every tp rank.
  comm::Communicator* c = &device_;
  callbacks_.sum = [c](Tensor& x) {
    NvtxRange r("tp_all_reduce");
    c->all_reduce(x, comm::ReduceOp::sum);
  };
  callbacks_.max = [c](Tensor& x) {
    NvtxRange r("tp_all_reduce_max");
    c->all_reduce(x, comm::ReduceOp::max);
  };
  callbacks_.gather_rows = [c](const Tensor& shard, Tensor& full) {
    NvtxRange r("sp_all_gather");
    c->all_gather(shard, full);
  };
  callbacks_.scatter_rows = [c](const Tensor& full, Tensor& shard) {
    NvtxRange r("sp_reduce_scatter");
    c->reduce_scatter(full, shard, comm::ReduceOp::sum);
  };
  // The buffers stay alive until the returned function has run: the model holds them.
  callbacks_.sum_async = [c](Tensor& x) -> model::TensorParallelComm::Wait {
    NvtxRange r("tp_all_reduce_async");
    comm::Work w = c->all_reduce(x, comm::ReduceOp::sum, comm::async_call());
    return [w]() mutable { w.wait(); };
  };
  callbacks_.scatter_rows_async = [c](const Tensor& full, Tensor& shard) -> model::TensorParallelComm::Wait {
    NvtxRange r("sp_reduce_scatter_async");
    comm::Work w = c->reduce_scatter(full, shard, comm::ReduceOp::sum, comm::async_call());
    return [w]() mutable { w.wait(); };
  };
}

double TensorParallel::sum_scalar(double x) {
  return comm::sum_over(host_, x);
}

double TensorParallel::global_sum_squares(double local_all, double local_replicated) {
  // The replicated gradients are the same on every tp rank: count them once.
  return sum_scalar(local_all - local_replicated) + local_replicated;
}

void TensorParallel::sum_param_norms(const std::vector<model::ParamInfo>& infos, int slots, std::vector<double>& sums) {
  LMSCALE_CHECK(sums.size() == infos.size() * static_cast<std::size_t>(slots), "sum_param_norms: {} sums for {} x {}",
                sums.size(), infos.size(), slots);
  if (split_.rank != 0)
    for (std::size_t i = 0; i < infos.size(); ++i)
      if (infos[i].split_dim < 0)
        for (int k = 0; k < slots; ++k) sums[i * static_cast<std::size_t>(slots) + static_cast<std::size_t>(k)] = 0.0;
  std::vector<double> out(sums.size());
  host_.all_reduce(sums.data(), out.data(), sums.size(), DType::f64, comm::ReduceOp::sum).wait();
  sums.swap(out);
}

std::vector<float> TensorParallel::gather_full(const std::vector<model::ParamInfo>& infos,
                                               const std::vector<float>& local) {
  return gather_sliced(host_, infos, local);
}

std::vector<float> TensorParallel::slice_local(const std::vector<model::ParamInfo>& infos,
                                               const std::vector<float>& whole) const {
  return slice_whole(infos, whole);
}

}  // namespace lmscale::parallel
