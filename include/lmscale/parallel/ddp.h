#pragma once
// Distributed data parallel (docs/architecture.md §4): every rank holds all parameters and computes the
// gradient of its slice of the global batch; the gradients are summed over the data-parallel
// group (the model already scales them by 1/global tokens). Four ways, as in the seed:
//   naive    - after the backward, one blocking all-reduce per parameter;
//   flat     - after the backward, one all-reduce of all gradients at once (they already live in
//              one flat buffer, so "flattening" costs no copy);
//   overlap  - one asynchronous all-reduce per parameter, launched by the backward's grad-ready
//              hook as soon as that gradient is final, all waited on before the optimizer;
//   bucketed - parameters grouped, in reverse order, into buckets of at most bucket_mb (a larger
//              parameter is a bucket of its own); a bucket's asynchronous all-reduce starts when
//              its last gradient is ready. Buckets are contiguous ranges of the flat gradient
//              buffer, reduced in place.
// Gradients are communicated in the master dtype (fp32) in every precision mode: with bf16
// mixed precision the bf16 copies are only for the matmuls (docs/architecture.md §2 "fp32 gradients").
#include <memory>
#include <string>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/io/config.h"
#include "lmscale/parallel/grad_buckets.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/parallel/gradient_sync.h"

namespace lmscale::parallel {

class CopyEngineAllReduce;

enum class DdpMode { naive, flat, overlap, bucketed };
// The deck's parallel.ddp when dp > 1 (none: flat, one all-reduce of the flat gradients).
DdpMode ddp_mode_of(DdpKind kind);
const char* ddp_mode_name(DdpMode m);

// A contiguous range of parameters [first, last] (indices into the store) and of the flat
// gradient buffer [offset, offset+numel); buckets of at most max_bytes over the parameters in
// reverse order (parallel/grad_buckets.h).
using Bucket = parallel::GradBucket;
inline std::vector<Bucket> make_buckets(const std::vector<model::ParamInfo>& params, double max_bytes,
                                        std::size_t elem_bytes) {
  return parallel::gradient_buckets(params, max_bytes, elem_bytes);
}

class DataParallel final : public GradientSync {
 public:
  // grads: the group's communicator for gradient buffers (device of the parameters);
  // host: a communicator of the same ranks for host scalars.
  DataParallel(DdpMode mode, comm::Communicator& grads, comm::Communicator& host, model::ParameterStore& params,
               double bucket_mb);
  ~DataParallel() override;

  // Rank 0's parameters to every rank (docs/architecture.md §4), then the working copy is refreshed.
  void broadcast_parameters(Context& ctx);
  // parallel.grad_reduce_dtype: with bf16 the flat/overlap/bucketed collectives run on a bf16
  // copy of each range (rounded on ctx's stream), widened back into the fp32 gradients after the
  // wait. f32 (the default) reduces the gradients in place.
  void set_reduce_dtype(DType dtype, Context& ctx);
  // parallel.grad_exchange = copy-engine (bucketed, fp32, CUDA, one node): each bucket is
  // all-reduced over the copy engines instead of NCCL (parallel/copy_engine_all_reduce.h).
  // Collective over host.
  void use_copy_engine(ops::Runtime& rt);
  model::ParallelContext hooks(int micro, int micro_count) override;
  void finish(Context& ctx) override;
  double sum_scalar(double x) override;
  std::string name() const override { return ddp_mode_name(mode_); }
  const std::vector<Bucket>& buckets() const { return buckets_; }

 private:
  void on_ready(int param);
  void launch(std::int64_t offset, std::int64_t numel);
  void widen_staged();

  DdpMode mode_;
  comm::Communicator& grads_;
  comm::Communicator& host_;
  model::ParameterStore& params_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;       // parameter -> bucket
  std::vector<int> pending_;         // bucket -> gradients not yet ready this step
  std::vector<comm::Work> inflight_;
  // Reduced-precision collectives: the staging copy of each in-flight range and the fp32 range
  // it is widened back into (parallel to inflight_).
  struct Staged {
    Tensor stage, dst;
  };
  std::vector<Staged> staged_;
  DType reduce_dtype_ = DType::f32;
  Context* ctx_ = nullptr;
  std::unique_ptr<CopyEngineAllReduce> copy_engine_;
};

}  // namespace lmscale::parallel
