#pragma once
// A copy lane between device memory and pinned host memory, for optimizer offload
// (parallel.offload, docs/parallel.md "CPU offload"): its own stream of the lowest priority, so
// the copies run on the copy engines beside the compute and never take SMs, and fences that the
// compute stream or a host thread can wait on.
//
// It is meant for one worker thread at a time (besides the thread that created it): that thread
// calls bind_thread() first, then queues copies and records fences; any thread may wait on a fence
// it was handed. Host memory the lane copies asynchronously must come from pinned(): pageable
// memory would make every copy a synchronous, staged one.
//
// On a CPU runtime the "device" is the host: copies are memcpy, done when copy() returns, and
// every fence has already passed. Code written against the lane thus runs (and is tested) the
// same way on CPU ranks.
#include <memory>

#include "lmscale/core/allocator.h"
#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::ops {

class HostTransfer {
 public:
  explicit HostTransfer(Runtime& rt);
  ~HostTransfer();
  HostTransfer(const HostTransfer&) = delete;
  HostTransfer& operator=(const HostTransfer&) = delete;

  // Page-locked host memory (cudaHostAlloc) for the lane's host buffers, counted in its own
  // tracker; on CPU the runtime's host allocator.
  Allocator& pinned();

  // Makes the calling thread use the runtime's device (CUDA's current device is per thread).
  void bind_thread();

  // A point on a stream's timeline that others can wait for. Default-constructed: already passed.
  struct Fence {
    std::shared_ptr<void> event;   // cudaEvent_t; null on CPU
  };
  // A fence after everything queued so far on the lane, or on `ctx`'s stream.
  Fence fence();
  Fence fence(Context& ctx);

  // Queues dst <- src on the lane (same dtype and size; one side in device memory, the other in
  // pinned() memory, or both on the host on CPU).
  void copy(const Tensor& src, Tensor& dst);
  // The lane's later copies wait for `f` (no host wait).
  void after(const Fence& f);
  // The calling host thread waits for `f`.
  void wait(const Fence& f);
  // `ctx`'s stream waits for `f` (no host wait).
  void wait_on(Context& ctx, const Fence& f);

 private:
  struct Lane;
  Runtime& rt_;
  std::unique_ptr<Lane> lane_;
};

}  // namespace lmscale::ops
