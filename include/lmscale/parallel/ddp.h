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
// overlap and bucketed are the gradient bucket reducer (parallel/bucket_reducer.h) with this
// class's all-reduce, or the copy engines (bucketed), as its backend; overlap's buckets are one
// parameter each.
// Gradients are communicated in the master dtype (fp32) in every precision mode: with bf16
// mixed precision the bf16 copies are only for the matmuls (docs/architecture.md §2 "fp32 gradients").
#include <memory>
#include <optional>
#include <string>

#include "lmscale/comm/communicator.h"
#include "lmscale/io/config.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/parallel/bucket_reducer.h"
#include "lmscale/parallel/gradient_sync.h"
#include "lmscale/parallel/reductions_in_flight.h"

namespace lmscale::parallel {

class CopyEngineAllReduce;

enum class DdpMode { naive, flat, overlap, bucketed };
// The deck's parallel.ddp when dp > 1 (none: flat, one all-reduce of the flat gradients).
DdpMode ddp_mode_of(DdpKind kind);
const char* ddp_mode_name(DdpMode m);

class DataParallel final : public GradientSync, private BucketBackend {
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

 private:
  // BucketBackend: the asynchronous all-reduce of a complete bucket (overlap: of a parameter).
  void begin_step() override { inflight_.clear(); }
  void launch(int bucket) override;
  void complete() override { inflight_.wait(ctx_); }
  // All-reduces elements [offset, offset + numel) of the flat gradients asynchronously (on a
  // staging copy with a reduce dtype other than the gradients').
  void all_reduce_range(std::int64_t offset, std::int64_t numel);

  DdpMode mode_;
  comm::Communicator& grads_;
  comm::Communicator& host_;
  model::ParameterStore& params_;
  std::optional<BucketReducer> reducer_;   // overlap and bucketed
  ReductionsInFlight inflight_;
  DType reduce_dtype_ = DType::f32;
  Context* ctx_ = nullptr;   // where staged copies are cast (set_reduce_dtype)
  std::unique_ptr<CopyEngineAllReduce> copy_engine_;
};

}  // namespace lmscale::parallel
