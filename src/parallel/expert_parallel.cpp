// Expert parallelism's collectives and bookkeeping (parallel/expert_parallel.h).
#include "lmscale/parallel/expert_parallel.h"

#include <algorithm>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/model/tensor_parallel.h"
#include "lmscale/parallel/sliced_parameters.h"

namespace lmscale::parallel {

ExpertParallel::ExpertParallel(comm::Communicator& device, comm::Communicator& host) : device_(device), host_(host) {
  LMSCALE_CHECK(device.size() == host.size() && device.rank() == host.rank(),
                "expert parallel: device ({} of {}) and host ({} of {}) communicators differ", device.rank(),
                device.size(), host.rank(), host.size());
  split_.degree = device.size();
  split_.rank = device.rank();
  // The model calls these in the same order on every ep rank (every MoE block's forward and
  // backward); each returns when its result is usable by the next op on the compute stream.
  comm::Communicator* h = &host_;
  comm::Communicator* d = &device_;
  callbacks_.counts = [h](const std::vector<std::int64_t>& send, std::int64_t per, std::vector<std::int64_t>& recv) {
    NvtxRange r("ep_counts");
    LMSCALE_CHECK(static_cast<std::int64_t>(send.size()) == per * h->size(), "expert parallel counts: {} values for {} "
                  "ranks of {}", send.size(), h->size(), per);
    recv.assign(send.size(), 0);
    h->all_to_all(send.data(), recv.data(), static_cast<std::size_t>(per), DType::i64).wait();
  };
  callbacks_.rows = [this, d](const Tensor& send, const std::vector<std::int64_t>& send_rows, Tensor& recv,
                              const std::vector<std::int64_t>& recv_rows) {
    if (copy_engine_) {
      copy_engine_->rows(send, send_rows, recv, recv_rows);
      return;
    }
    NvtxRange r("ep_all_to_all");
    const std::int64_t width = send.numel() > 0 ? send.numel() / send.dim(0) : recv.numel() / std::max<std::int64_t>(1, recv.dim(0));
    std::vector<std::size_t> sc, rc;
    for (std::int64_t n : send_rows) sc.push_back(static_cast<std::size_t>(n * width));
    for (std::int64_t n : recv_rows) rc.push_back(static_cast<std::size_t>(n * width));
    d->all_to_all_v(send, sc, recv, rc).wait();
  };
}

void ExpertParallel::use_copy_engine(ops::Runtime& rt, std::size_t slot_bytes) {
  if (device_.backend() != comm::Backend::nccl || rt.ctx().device != Device::cuda)
    throw UsageError("parallel.ep_exchange = copy-engine moves the token rows between GPUs with their copy engines, "
                     "but this run's expert-parallel group does not run on CUDA with the nccl backend; set "
                     "parallel.ep_exchange = nccl, or parallel.device = cuda with parallel.backend = nccl");
  copy_engine_ = std::make_unique<CopyEngineAllToAll>(host_, slot_bytes, rt);
}

bool ExpertParallel::holds_slice(const model::ParamInfo& p) { return model::is_expert_parameter(p); }

comm::Work ExpertParallel::sum_gradient(Tensor& g, bool async) {
  NvtxRange r("ep_dense_grad_sum");
  return device_.all_reduce(g, comm::ReduceOp::sum, comm::CallOptions{async, std::nullopt});
}

comm::Work ExpertParallel::sum_gradients(const std::vector<Tensor>& grads) {
  NvtxRange r("ep_dense_grad_sums");
  return device_.all_reduce_group(grads, comm::ReduceOp::sum, comm::CallOptions{true, std::nullopt});
}

double ExpertParallel::sum_scalar(double x) { return comm::sum_over(host_, x); }

double ExpertParallel::global_sum_squares(double all, double experts) {
  // The dense gradients are the same on every ep rank (summed over the group): counted once.
  return (all - experts) + sum_scalar(experts);
}

std::vector<float> ExpertParallel::gather_full(const std::vector<model::ParamInfo>& infos,
                                               const std::vector<float>& local) {
  return gather_sliced(host_, infos, local);
}

std::vector<float> ExpertParallel::slice_local(const std::vector<model::ParamInfo>& infos,
                                               const std::vector<float>& whole) const {
  return slice_whole(infos, whole);
}

}  // namespace lmscale::parallel
