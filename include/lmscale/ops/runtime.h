#pragma once
// Runtime: the per-process compute resources for one device: allocators, the op Context and, on
// CUDA, the stream, cuBLASLt handle and workspace (ops/cuda/runtime_cuda.cpp). Jobs create one.
#include <cstdint>
#include <memory>
#include <string>

#include "lmscale/core/allocator.h"
#include "lmscale/core/context.h"

namespace lmscale::ops {

class Runtime {
 public:
  // device: cpu or cuda; cuda_device: the GPU index (local rank); tf32: precision.tf32;
  // gemm_autotune: precision.gemm_autotune (CUDA only).
  Runtime(Device device, int cuda_device, bool tf32, bool gemm_autotune = false);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Context& ctx() { return ctx_; }
  Device device() const { return ctx_.device; }
  Allocator& allocator() { return *ctx_.allocator; }
  HostAllocator& host() { return host_; }
  // Waits until all work queued on the compute stream is done (no-op on CPU).
  void synchronize();
  // A point on the compute stream's timeline: a CUDA event on GPU, a host timestamp on CPU.
  struct Mark {
    double host_s = 0;
    std::shared_ptr<void> event;   // cudaEvent_t, returned to the runtime's pool when released
    bool captured = false;         // recorded into a CUDA graph capture: orders, never timed
  };
  Mark mark();
  // Milliseconds between two marks; waits until `end` has happened.
  double elapsed_ms(const Mark& begin, const Mark& end);
  // True while an ops::CudaGraph captures the compute stream (ops/cuda_graph.h). Marks made then
  // are captured: wait() on one still orders streams inside the graph (fork and join), but
  // elapsed_ms with one is 0 and done() is true: a captured step's phases are not timed, and a
  // host wait for a captured event would end the capture.
  bool capturing() const { return capturing_; }
  void set_capturing(bool on) { capturing_ = on; }

  // A second context on a side stream of the same device (CUDA: created on first use, low
  // priority, same allocator and library resources). Only ops that launch on ctx.stream may take
  // it: adamw and the elementwise ops (fill, add, scale, cast, copy); the others launch on the
  // compute stream and would silently lose the side stream's ordering. The allocator is ordered
  // on the compute stream, so ops that take a scratch buffer must not run on it either. On CPU it
  // is ctx() itself: work on it is synchronous.
  Context& side_ctx();
  // A mark on `on`'s stream (mark() is the compute stream's).
  Mark mark(Context& on);
  // Makes `waiter`'s stream wait until `m` has happened (no host wait; no-op on CPU).
  void wait(Context& waiter, const Mark& m);
  // Whether `m` has happened (always true on CPU).
  bool done(const Mark& m);
  // Device name ("cpu" or e.g. "NVIDIA H100 80GB HBM3").
  std::string device_name() const;
  // The GPU's compute capability as major * 10 + minor (90 for Hopper); 0 on CPU.
  int compute_capability() const;

  // parallel.comm_sms: SMs left to NCCL's kernels while GEMMs run beside them. Throws UsageError
  // (naming the key) when it is more than half the GPU's SMs, or not 0 on CPU.
  void set_comm_sms(int sms);
  int comm_sms() const { return comm_sms_; }
  // The SMs the GEMM plans made now target (0 = all of them).
  int gemm_sm_target() const;
  // The compute stream's cuBLASLt plan cache so far (ops/cuda/gemm.h; zeros on CPU): plans made
  // (each a heuristic query on the host), products run on a shape class's plan, and class-path
  // products whose shape the class's algorithm refused (run on an exact plan instead); and the
  // MoE experts' grouped GEMMs (model.moe_expert_gemm = grouped; ops/cuda/gemm_grouped.h): calls
  // made, and products of lists cuBLAS could not group (run as a loop instead); calls of our
  // grouped GEMM for Hopper (model.moe_expert_gemm = wgmma; 0 where that form fell back to the loop).
  struct GemmPlanCounts {
    std::int64_t plans_made = 0, class_products = 0, class_fallbacks = 0;
    std::int64_t grouped_calls = 0, grouped_looped_products = 0;
    std::int64_t sm90_grouped_calls = 0;
  };
  GemmPlanCounts gemm_plan_counts() const;
  // While one is alive (and comm_sms() > 0, and `on`), the GEMM plans made target the GPU's SMs
  // minus comm_sms() (cuBLASLt's SM_COUNT_TARGET; plans are cached per target). Scopes nest.
  class GemmCarveout {
   public:
    GemmCarveout(Runtime& rt, bool on);
    ~GemmCarveout();
    GemmCarveout(const GemmCarveout&) = delete;
    GemmCarveout& operator=(const GemmCarveout&) = delete;

   private:
    Runtime& rt_;
    int previous_ = 0;
  };

 private:
  // The SM target new GEMM plans get (0 = all SMs).
  void set_gemm_sm_target(int sms);
  int comm_sms_ = 0;
  bool capturing_ = false;
  HostAllocator host_;
  std::unique_ptr<Allocator> device_alloc_;
  Context ctx_;
  Context side_ctx_;
  struct CudaState;
  std::unique_ptr<CudaState> cuda_;
};

}  // namespace lmscale::ops
