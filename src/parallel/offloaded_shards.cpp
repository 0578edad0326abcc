#include "lmscale/parallel/offloaded_shards.h"

#include <algorithm>
#include <cstring>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/ops/ops.h"

namespace lmscale::parallel {

OffloadedShards::OffloadedShards(ops::Runtime& rt, std::int64_t numel, std::vector<Range> units, DType compute,
                                 const OptimConfig& cfg, int threads, ShardCopy copy, std::int64_t chunk)
    : rt_(rt), compute_(compute), threads_(std::max(1, threads)), copy_(copy), units_(std::move(units)) {
  LMSCALE_CHECK(cfg.name == OptimizerName::adamw, "parallel.offload: AdamW only (deck checks)");
  host_ctx_.device = Device::cpu;
  host_ctx_.allocator = &rt.host();
  host_ctx_.host = &rt.host();
  // Chunks of at most `chunk` elements, never across a unit boundary, in forward order.
  LMSCALE_CHECK(chunk > 0, "OffloadedShards: chunk {} <= 0", chunk);
  for (const Range& u : units_) {
    for (std::int64_t a = u.offset; a < u.offset + u.count; a += chunk)
      chunks_.push_back({a, std::min(chunk, u.offset + u.count - a)});
    last_chunk_.push_back(u.count > 0 ? chunks_.size() - 1 : chunks_.size());
  }
  optimizer_ = std::make_unique<optim::HostAdamW>(cfg, numel, host_ctx_, threads_);
  master_ = Tensor::empty({numel}, DType::f32, rt.host(), "offloaded_master");
  if (numel > 0) std::memset(master_.data(), 0, master_.nbytes());
  lane_ = std::make_unique<ops::HostTransfer>(rt);
  if (copy_ == ShardCopy::device)
    device_copy_ = Tensor::empty({numel}, compute_, *rt.ctx().allocator, "offloaded_device_copy");
  else   // the worker's output and the source of each gather's copy up: pinned, so that copy is asynchronous
    host_copy_ = Tensor::empty({numel}, compute_, lane_->pinned(), "offloaded_host_copy");
  std::int64_t slot = 0;
  for (const Chunk& c : chunks_) slot = std::max(slot, c.count);
  for (int k = 0; k < 2; ++k) {
    grad_slot_[k] = Tensor::empty({slot}, DType::f32, lane_->pinned(), "offload_staging");
    if (copy_ == ShardCopy::device) copy_slot_[k] = Tensor::empty({slot}, compute_, lane_->pinned(), "offload_staging");
  }
  copied_.resize(chunks_.size());
  worker_ = std::thread([this] { run_worker(); });
}

OffloadedShards::~OffloadedShards() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void OffloadedShards::run_worker() {
  try {
    lane_->bind_thread();
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
  }
  for (;;) {
    Tensor grads;
    double lr = 0, scale = 1;
    ops::HostTransfer::Fence ready;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || job_; });
      if (stop_ && !job_) return;
      job_ = false;
      grads = job_grads_;
      lr = job_lr_;
      scale = job_scale_;
      ready = job_ready_;
      if (error_) {   // the lane could not be bound: report it at once
        done_ = chunks_.size();
        in_flight_ = false;
        cv_.notify_all();
        continue;
      }
    }
    try {
      update(grads, lr, scale, ready);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = chunks_.size();
      in_flight_ = false;
    }
    cv_.notify_all();
  }
}

void OffloadedShards::update(const Tensor& grads, double lr, double grad_scale, const ops::HostTransfer::Fence& ready) {
  const std::size_t n = chunks_.size();
  if (n == 0) return;
  lane_->after(ready);   // the gradients are final
  ops::HostTransfer::Fence down[2], up[2];
  auto fetch = [&](std::size_t c) {   // D2H of chunk c's gradients into slot c % 2
    const Chunk& k = chunks_[c];
    Tensor dst = grad_slot_[c % 2].flat_range(0, k.count);
    lane_->copy(grads.flat_range(k.offset, k.count), dst);
    down[c % 2] = lane_->fence();
  };
  // The arithmetic of the AdamW this run would use without offload (ops/host_adamw.h).
  const ops::AdamWArithmetic arithmetic =
      rt_.device() == Device::cuda ? ops::AdamWArithmetic::cuda_kernel : ops::AdamWArithmetic::cpu_reference;
  fetch(0);
  for (std::size_t c = 0; c < n; ++c) {
    const Chunk& k = chunks_[c];
    if (c + 1 < n) fetch(c + 1);          // slot (c+1) % 2 was chunk c-1's, whose update is done
    // Also the step's gathers have read the host copy (pinned_host): `ready` precedes this copy.
    lane_->wait(down[c % 2]);
    lane_->wait(up[c % 2]);               // chunk c-2's copy back has left the slot
    Tensor p = master_.flat_range(k.offset, k.count), g = grad_slot_[c % 2].flat_range(0, k.count);
    const bool on_host = copy_ == ShardCopy::pinned_host;
    Tensor out = on_host ? host_copy_.flat_range(k.offset, k.count) : copy_slot_[c % 2].flat_range(0, k.count);
    const bool lowp = compute_ != DType::f32;
    optimizer_->step_host(p, g, lowp ? &out : nullptr, k.offset, lr, grad_scale, arithmetic);
    if (!lowp) std::memcpy(out.data(), p.data(), p.nbytes());
    if (!on_host) {   // pinned_host: the gathers copy it up themselves (device_shard)
      Tensor dst = device_copy_.flat_range(k.offset, k.count);
      lane_->copy(out, dst);
      up[c % 2] = lane_->fence();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      copied_[c] = up[c % 2];
      done_ = c + 1;
    }
    cv_.notify_all();
  }
}

void OffloadedShards::start_step(Context& ctx, const Tensor& grads, double lr, double grad_scale) {
  LMSCALE_CHECK(grads.dtype() == DType::f32 && grads.numel() == master_.numel(),
                "OffloadedShards: fp32 gradients of the shard's {} elements expected", master_.numel());
  settle();
  if (stale_) refresh(ctx);
  optimizer_->begin_step();
  ops::HostTransfer::Fence ready = lane_->fence(ctx);
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_grads_ = grads;
    job_lr_ = lr;
    job_scale_ = grad_scale;
    job_ready_ = std::move(ready);
    job_ = true;
    in_flight_ = true;
    done_ = 0;
  }
  cv_.notify_all();
}

void OffloadedShards::settle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !in_flight_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
  // Every copy back has been queued; the host may now touch the staging slots and the master, and
  // the device copy is complete once the lane drains.
  for (const auto& f : copied_) lane_->wait(f);
}

Tensor OffloadedShards::device_shard(Context& ctx, int u) {
  const Range& r = units_[static_cast<std::size_t>(u)];
  if (stale_) {
    settle();
    refresh(ctx);
  }
  const std::size_t last = last_chunk_[static_cast<std::size_t>(u)];
  if (last < chunks_.size()) {
    ops::HostTransfer::Fence f;
    {
      NvtxRange wait("offload_wait");
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !in_flight_ || done_ > last || error_; });
      if (error_) {
        std::exception_ptr e = error_;
        error_ = nullptr;
        lock.unlock();
        std::rethrow_exception(e);
      }
      f = copied_[last];
    }
    lane_->wait_on(ctx, f);   // the lane's copies are in order: the unit's earlier chunks are there too
  }
  if (copy_ == ShardCopy::device) return device_copy_.flat_range(r.offset, r.count);
  // pinned_host: the worker has written u's range (the wait above); up on the compute stream.
  Tensor send = Tensor::empty({r.count}, compute_, *ctx.allocator, "fsdp_send");
  if (r.count > 0) ops::copy(ctx, host_copy_.flat_range(r.offset, r.count), send);
  return send;
}

void OffloadedShards::refresh_device(Context& ctx) {
  // The master to the device in its own rounding: through an fp32 device chunk and the device's
  // cast (what FSDP without offload sends), one chunk at a time.
  const std::int64_t n = master_.numel();
  if (n > 0) {
    const std::int64_t step = std::min(kChunk, n);
    Tensor tmp = Tensor::empty({step}, DType::f32, *ctx.allocator, "offload_refresh");
    for (std::int64_t a = 0; a < n; a += step) {
      const std::int64_t c = std::min(step, n - a);
      Tensor t = tmp.flat_range(0, c), dst = device_copy_.flat_range(a, c);
      ops::copy(ctx, master_.flat_range(a, c), t);
      if (compute_ == DType::f32) ops::copy(ctx, t, dst);
      else ops::cast(ctx, t, dst);
    }
    rt_.synchronize();   // tmp is freed stream-ordered; the master may change on the host after this
  }
  for (auto& f : copied_) f = {};
  stale_ = false;
}

void OffloadedShards::refresh_host() {
  // The master into the pinned host copy with the device cast's rounding (round to nearest even:
  // ops::cast on the host, core/dtype.h). The device may still be copying from the host copy
  // (an earlier gather's copy up, stream-ordered): wait for it before overwriting.
  rt_.synchronize();
  if (master_.numel() > 0) ops::cast(host_ctx_, master_, host_copy_);
  for (auto& f : copied_) f = {};
  stale_ = false;
}

std::int64_t OffloadedShards::transfer_bytes_per_step() const {
  const std::int64_t up = copy_ == ShardCopy::device ? static_cast<std::int64_t>(dtype_size(compute_)) : 0;
  return master_.numel() * (4 + up);
}

}  // namespace lmscale::parallel
