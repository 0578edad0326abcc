#include "lmscale/ops/runtime.h"

#include <chrono>

#include "lmscale/core/error.h"

#ifdef LMSCALE_WITH_CUDA
#include "cuda/resources.h"
#include "cuda/runtime_state.h"
#endif

namespace lmscale::ops {

#ifndef LMSCALE_WITH_CUDA
struct Runtime::CudaState {};
#endif

Runtime::Runtime(Device device, int cuda_device, bool tf32, bool gemm_autotune) {
  ctx_.device = device;
  ctx_.host = &host_;
  ctx_.allow_tf32 = tf32;
  if (device == Device::cpu) {
    ctx_.allocator = &host_;
    return;
  }
#ifdef LMSCALE_WITH_CUDA
  cuda_ = std::make_unique<CudaState>(cuda_device);
  ctx_.allocator = cuda_->allocator.get();
  ctx_.stream = cuda_->stream;
  ctx_.cuda = cuda_->resources();
  if (gemm_autotune) static_cast<cuda::Resources*>(ctx_.cuda)->gemm_autotune = true;
#else
  (void)cuda_device;
  (void)gemm_autotune;
  throw UsageError("parallel.device=cuda: this lmscale was built without CUDA; use parallel.device=cpu or rebuild with the CUDA toolkit");
#endif
}

Runtime::~Runtime() = default;

void Runtime::synchronize() {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) cuda_->synchronize();
#endif
}

Runtime::Mark Runtime::mark() {
  Mark m;
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) {
    m.event = cuda_->record_event();
    return m;
  }
#endif
  m.host_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return m;
}

Context& Runtime::side_ctx() {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) {
    if (!side_ctx_.stream) {
      side_ctx_ = ctx_;
      side_ctx_.stream = cuda_->side_stream();
    }
    return side_ctx_;
  }
#endif
  return ctx_;
}

Runtime::Mark Runtime::mark(Context& on) {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) {
    Mark m;
    m.event = cuda_->record_event(static_cast<cudaStream_t>(on.stream));
    return m;
  }
#endif
  (void)on;
  return mark();
}

void Runtime::wait(Context& waiter, const Mark& m) {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) cuda_->wait(static_cast<cudaStream_t>(waiter.stream), m.event.get());
#endif
  (void)waiter;
  (void)m;
}

bool Runtime::done(const Mark& m) {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) return cuda_->done(m.event.get());
#endif
  (void)m;
  return true;
}

double Runtime::elapsed_ms(const Mark& begin, const Mark& end) {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) return cuda_->elapsed_ms(begin.event.get(), end.event.get());
#endif
  return (end.host_s - begin.host_s) * 1e3;
}

std::string Runtime::device_name() const {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) return cuda_->name;
#endif
  return "cpu";
}

}  // namespace lmscale::ops
