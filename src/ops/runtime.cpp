#include "lmscale/ops/runtime.h"

#include <fmt/format.h>

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
    m.captured = capturing_;
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
    m.captured = capturing_;
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
  if (cuda_) return m.captured || cuda_->done(m.event.get());
#endif
  (void)m;
  return true;
}

double Runtime::elapsed_ms(const Mark& begin, const Mark& end) {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) return begin.captured || end.captured ? 0.0 : cuda_->elapsed_ms(begin.event.get(), end.event.get());
#endif
  return (end.host_s - begin.host_s) * 1e3;
}

std::string Runtime::device_name() const {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) return cuda_->name;
#endif
  return "cpu";
}

int Runtime::compute_capability() const {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) return cuda_->compute_capability;
#endif
  return 0;
}

void Runtime::set_comm_sms(int sms) {
  if (sms < 0) throw UsageError(fmt::format("parallel.comm_sms = {} must be >= 0", sms));
  if (sms == 0) {
    comm_sms_ = 0;
    return;
  }
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) {
    const int total = static_cast<cuda::Resources*>(ctx_.cuda)->num_sms;
    if (sms > total / 2)
      throw UsageError(fmt::format("parallel.comm_sms = {} is more than half of the {} SMs of {}; NCCL needs a few "
                                   "(4 to 16); lower parallel.comm_sms",
                                   sms, total, cuda_->name));
    comm_sms_ = sms;
    return;
  }
#endif
  throw UsageError(fmt::format("parallel.comm_sms = {} needs a CUDA device; set it to 0 on the CPU", sms));
}

void Runtime::set_gemm_sm_target(int sms) {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) static_cast<cuda::Resources*>(ctx_.cuda)->gemm_sm_target = sms;
#endif
  (void)sms;
}

int Runtime::gemm_sm_target() const {
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) return static_cast<const cuda::Resources*>(ctx_.cuda)->gemm_sm_target;
#endif
  return 0;
}

Runtime::GemmPlanCounts Runtime::gemm_plan_counts() const {
  GemmPlanCounts c;
#ifdef LMSCALE_WITH_CUDA
  if (cuda_) {
    const auto& cache = static_cast<const cuda::Resources*>(ctx_.cuda)->gemm_plans;
    c.plans_made = cache.plans_made;
    c.class_products = cache.class_products;
    c.class_fallbacks = cache.class_fallbacks;
    const auto& grouped = static_cast<const cuda::Resources*>(ctx_.cuda)->grouped_gemm;
    c.grouped_calls = grouped.calls;
    c.grouped_looped_products = grouped.looped_products;
    c.sm90_grouped_calls = grouped.sm90_calls;
  }
#endif
  return c;
}

Runtime::GemmCarveout::GemmCarveout(Runtime& rt, bool on) : rt_(rt) {
  int target = 0;
#ifdef LMSCALE_WITH_CUDA
  if (on && rt.comm_sms_ > 0 && rt.cuda_)
    target = static_cast<cuda::Resources*>(rt.ctx_.cuda)->num_sms - rt.comm_sms_;
#endif
  (void)on;
  previous_ = rt_.gemm_sm_target();
  if (target > 0) rt_.set_gemm_sm_target(target);   // an inner scope that is off keeps the outer one
}

Runtime::GemmCarveout::~GemmCarveout() { rt_.set_gemm_sm_target(previous_); }

}  // namespace lmscale::ops
