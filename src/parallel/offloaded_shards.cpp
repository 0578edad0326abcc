#include "lmscale/parallel/offloaded_shards.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/ops/ops.h"

namespace lmscale::parallel {

namespace {
Context host_context(ops::Runtime& rt) {
  Context h;
  h.device = Device::cpu;
  h.allocator = &rt.host();
  h.host = &rt.host();
  return h;
}
}  // namespace

OffloadedShards::OffloadedShards(ops::Runtime& rt, std::int64_t numel, std::vector<Range> units, DType compute,
                                 const OptimConfig& cfg, int threads, ShardCopy copy, std::int64_t chunk,
                                 bool delayed_update)
    : rt_(rt), compute_(compute), threads_(std::max(1, threads)), copy_(copy), delayed_(delayed_update) {
  LMSCALE_CHECK(cfg.name == OptimizerName::adamw, "parallel.offload: AdamW only (deck checks)");
  LMSCALE_CHECK(!delayed_ || copy_ == ShardCopy::pinned_host,
                "OffloadedShards: the delayed update needs the shard's copy in pinned host memory (deck checks)");
  host_ctx_ = host_context(rt);
  optimizer_ = std::make_unique<optim::HostAdamW>(cfg, numel, host_ctx_, threads_);
  master_ = Tensor::empty({numel}, DType::f32, rt.host(), "offloaded_master");
  lane_ = std::make_unique<ops::HostTransfer>(rt);
  if (copy_ == ShardCopy::device) {
    device_copy_ = Tensor::empty({numel}, compute_, *rt.ctx().allocator, "offloaded_device_copy");
    for (const Range& u : units) targets_.push_back({u.offset, u.count, device_copy_.flat_range(u.offset, u.count), Tensor()});
  } else {   // the worker's output and the source of each gather's copy up: pinned, so that copy is asynchronous
    host_copy_[0] = Tensor::empty({numel}, compute_, lane_->pinned(), "offloaded_host_copy");
    if (delayed_) {
      host_copy_[1] = Tensor::empty({numel}, compute_, lane_->pinned(), "offloaded_host_copy");
      write_ = 1;
    }
  }
  init(std::move(units), chunk);
}

OffloadedShards::OffloadedShards(ops::Runtime& rt, std::int64_t numel, std::vector<Range> units,
                                 std::vector<Target> targets, DType compute, const OptimConfig& cfg, int threads,
                                 std::int64_t chunk)
    : rt_(rt), compute_(compute), threads_(std::max(1, threads)), copy_(ShardCopy::device),
      targets_(std::move(targets)) {
  LMSCALE_CHECK(cfg.name == OptimizerName::adamw, "parallel.offload: AdamW only (deck checks)");
  std::int64_t at = 0;
  for (const Target& t : targets_) {
    LMSCALE_CHECK(!t.also.defined() || (t.dst.dtype() == DType::f32 && t.also.dtype() == compute_ &&
                                        t.also.numel() == t.count && t.also.device() == rt.device()),
                  "OffloadedShards: the target at {} has a second destination that is not a {} copy of an fp32 target",
                  t.offset, dtype_name(compute_));
    LMSCALE_CHECK(t.offset == at && t.count >= 0 && t.dst.numel() == t.count && t.dst.device() == rt.device() &&
                      (t.dst.dtype() == compute_ || t.dst.dtype() == DType::f32),
                  "OffloadedShards: target at {} of {} elements does not continue the shard at {} on the device in {} "
                  "or fp32",
                  t.offset, t.count, at, dtype_name(compute_));
    at += t.count;
  }
  LMSCALE_CHECK(at == numel, "OffloadedShards: the targets cover {} of {} elements", at, numel);
  host_ctx_ = host_context(rt);
  optimizer_ = std::make_unique<optim::HostAdamW>(cfg, numel, host_ctx_, threads_);
  master_ = Tensor::empty({numel}, DType::f32, rt.host(), "offloaded_master");
  lane_ = std::make_unique<ops::HostTransfer>(rt);
  init(std::move(units), chunk);
}

void OffloadedShards::init(std::vector<Range> units, std::int64_t chunk) {
  units_ = std::move(units);
  if (master_.numel() > 0) std::memset(master_.data(), 0, master_.nbytes());
  // Chunks of at most `chunk` elements, never across a unit (or target) boundary, in forward order.
  LMSCALE_CHECK(chunk > 0, "OffloadedShards: chunk {} <= 0", chunk);
  for (std::size_t ui = 0; ui < units_.size(); ++ui) {
    const Range& u = units_[ui];
    for (std::int64_t a = u.offset; a < u.offset + u.count;) {
      std::size_t t = 0;
      std::int64_t end = std::min(a + chunk, u.offset + u.count);
      if (copy_ == ShardCopy::device) {
        while (t < targets_.size() && targets_[t].offset + targets_[t].count <= a) ++t;
        LMSCALE_CHECK(t < targets_.size(), "OffloadedShards: element {} has no target", a);
        end = std::min(end, targets_[t].offset + targets_[t].count);
      }
      chunks_.push_back({a, end - a, t, static_cast<int>(ui)});
      a = end;
    }
    // An empty unit (a ZeRO range that starts after it) waits for nothing: not for the next
    // unit's first chunk, which a rank whose range starts at a later unit would otherwise hold
    // up the forward's first units for.
    last_chunk_.push_back(u.count > 0 ? chunks_.size() - 1 : kNoChunk);
  }
  std::int64_t slot = 0, also_slot = 0;
  std::size_t widest = dtype_size(compute_);
  for (const Chunk& c : chunks_) {
    slot = std::max(slot, c.count);
    if (copy_ == ShardCopy::device && targets_[c.target].also.defined()) also_slot = std::max(also_slot, c.count);
  }
  for (const Target& t : targets_) widest = std::max(widest, dtype_size(t.dst.dtype()));
  for (int k = 0; k < 2; ++k) {
    grad_slot_[k] = Tensor::empty({slot}, DType::f32, lane_->pinned(), "offload_staging");
    if (copy_ == ShardCopy::device)
      copy_slot_[k] = Tensor::empty({slot}, widest == 4 ? DType::f32 : compute_, lane_->pinned(), "offload_staging");
    if (also_slot > 0) also_slot_[k] = Tensor::empty({also_slot}, compute_, lane_->pinned(), "offload_staging");
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
    std::vector<ops::GradPiece> grads;
    double lr = 0, scale = 1;
    ops::HostTransfer::Fence ready;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || job_; });
      if (stop_ && !job_) return;
      job_ = false;
      grads = std::move(job_grads_);
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

void OffloadedShards::update(const std::vector<ops::GradPiece>& grads, double lr, double grad_scale,
                             const ops::HostTransfer::Fence& ready) {
  const std::size_t n = chunks_.size();
  if (n == 0) return;
  lane_->after(ready);   // the gradients are final
  ops::HostTransfer::Fence down[2], up[2];
  auto fetch = [&](std::size_t c) {   // D2H of chunk c's gradients (from each piece it overlaps) into slot c % 2
    const Chunk& k = chunks_[c];
    for (const ops::GradPiece& piece : grads) {
      const std::int64_t a = std::max(k.offset, piece.offset);
      const std::int64_t e = std::min(k.offset + k.count, piece.offset + piece.grad.numel());
      if (a >= e) continue;
      Tensor dst = grad_slot_[c % 2].flat_range(a - k.offset, e - a);
      lane_->copy(piece.grad.flat_range(a - piece.offset, e - a), dst);
    }
    down[c % 2] = lane_->fence();
  };
  // The arithmetic of the AdamW this run would use without offload (ops/host_adamw.h).
  const ops::AdamWArithmetic arithmetic =
      rt_.device() == Device::cuda ? ops::AdamWArithmetic::cuda_kernel : ops::AdamWArithmetic::cpu_reference;
  fetch(0);
  for (std::size_t c = 0; c < n; ++c) {
    const Chunk& k = chunks_[c];
    if (before_unit_ && (c == 0 || chunks_[c - 1].unit != k.unit)) before_unit_(k.unit);
    if (c + 1 < n) fetch(c + 1);          // slot (c+1) % 2 was chunk c-1's, whose update is done
    // Also the step's gathers have read the host copy (pinned_host): `ready` precedes this copy.
    lane_->wait(down[c % 2]);
    lane_->wait(up[c % 2]);               // chunk c-2's copy back has left the slot
    Tensor p = master_.flat_range(k.offset, k.count), g = grad_slot_[c % 2].flat_range(0, k.count);
    const bool on_host = copy_ == ShardCopy::pinned_host;
    // The result in the dtype its destination holds: the compute dtype, or fp32 (a target of
    // fp32 weights: the master's values themselves).
    const DType out_dtype = on_host ? compute_ : targets_[k.target].dst.dtype();
    Tensor out = on_host ? host_copy_[write_].flat_range(k.offset, k.count)
                         : Tensor::view(copy_slot_[c % 2].data(), {k.count}, out_dtype, copy_slot_[c % 2].device());
    const bool lowp = out_dtype != DType::f32;
    const bool also = !on_host && targets_[k.target].also.defined();
    Tensor also_out = also ? also_slot_[c % 2].flat_range(0, k.count) : Tensor();
    optimizer_->step_host(p, g, lowp ? &out : also ? &also_out : nullptr, k.offset, lr, grad_scale, arithmetic);
    if (!lowp) std::memcpy(out.data(), p.data(), p.nbytes());
    if (!on_host) {   // pinned_host: the gathers copy it up themselves (device_shard)
      const Target& t = targets_[k.target];
      Tensor dst = t.dst.flat_range(k.offset - t.offset, k.count);
      lane_->copy(out, dst);
      if (also) {
        Tensor also_dst = t.also.flat_range(k.offset - t.offset, k.count);
        lane_->copy(also_out, also_dst);
      }
      up[c % 2] = lane_->fence();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      copied_[c] = up[c % 2];
      copied_down_ = k.offset + k.count;   // its gradients came down before its update (the wait above)
      done_ = c + 1;
    }
    cv_.notify_all();
  }
}

void OffloadedShards::start_step(Context& ctx, const Tensor& grads, double lr, double grad_scale) {
  LMSCALE_CHECK(grads.dtype() == DType::f32 && grads.numel() == master_.numel(),
                "OffloadedShards: fp32 gradients of the shard's {} elements expected", master_.numel());
  start_step(ctx, std::vector<ops::GradPiece>{{0, grads}}, lr, grad_scale);
}

void OffloadedShards::start_step(Context& ctx, std::vector<ops::GradPiece> grads, double lr, double grad_scale) {
  std::int64_t at = 0;
  for (const ops::GradPiece& g : grads) {
    LMSCALE_CHECK(g.offset == at && g.grad.dtype() == DType::f32,
                  "OffloadedShards: fp32 gradient pieces continuing the shard expected (a piece at {}, expected {})",
                  g.offset, at);
    at += g.grad.numel();
  }
  LMSCALE_CHECK(at == master_.numel(), "OffloadedShards: gradient pieces of {} elements for a shard of {}", at,
                master_.numel());
  settle();
  if (stale_) refresh(ctx);
  // The delayed update: the update just settled wrote [write_]; the next step's gathers read it,
  // and this one's result goes into the buffer this step's gathers read (after them: `ready`).
  if (delayed_) std::swap(read_, write_);
  optimizer_->begin_step();
  ops::HostTransfer::Fence ready = lane_->fence(ctx);
  {
    std::lock_guard<std::mutex> lock(mu_);
    held_grads_ = std::move(grads);
    job_grads_.clear();
    for (const ops::GradPiece& g : held_grads_)
      job_grads_.push_back({g.offset, Tensor::view(g.grad.data(), g.grad.shape(), g.grad.dtype(), g.grad.device())});
    copied_down_ = 0;
    job_lr_ = lr;
    job_scale_ = grad_scale;
    job_ready_ = std::move(ready);
    job_ = true;
    in_flight_ = true;
    done_ = 0;
  }
  cv_.notify_all();
}

void OffloadedShards::let_go_of_copied_grads() {
  std::vector<ops::GradPiece> gone;   // destroyed after the lock is released
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::int64_t copied = in_flight_ ? copied_down_ : std::numeric_limits<std::int64_t>::max();
    // Pieces still needed first, then those entirely below `copied`.
    const auto done = std::stable_partition(held_grads_.begin(), held_grads_.end(), [&](const ops::GradPiece& g) {
      return g.offset + g.grad.numel() > copied;
    });
    std::move(done, held_grads_.end(), std::back_inserter(gone));
    held_grads_.erase(done, held_grads_.end());
  }
}

void OffloadedShards::settle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !in_flight_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
  lock.unlock();
  let_go_of_copied_grads();   // the update is done: every piece
  lock.lock();
  // Every copy back has been queued; the host may now touch the staging slots and the master, and
  // the device copy is complete once the lane drains.
  for (const auto& f : copied_) lane_->wait(f);
}

void OffloadedShards::wait_unit(Context& ctx, int u) {
  if (stale_) {
    settle();
    refresh(ctx);
  }
  const std::size_t last = last_chunk_[static_cast<std::size_t>(u)];
  if (last >= chunks_.size()) return;
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
  let_go_of_copied_grads();
}

Tensor OffloadedShards::device_shard(Context& ctx, int u) {
  LMSCALE_CHECK(copy_ == ShardCopy::pinned_host || device_copy_.defined(),
                "OffloadedShards: device_shard() without a device copy of its own (the caller's targets)");
  const Range& r = units_[static_cast<std::size_t>(u)];
  if (!delayed_) {
    wait_unit(ctx, u);
  } else if (stale_) {   // the previous update's result needs no wait; a changed master does
    settle();
    refresh(ctx);
  }
  if (copy_ == ShardCopy::device) return device_copy_.flat_range(r.offset, r.count);
  // pinned_host: the worker has written u's range (the wait above, or, delayed, the update
  // before the one in flight); up on the compute stream.
  Tensor send = Tensor::empty({r.count}, compute_, *ctx.allocator, "fsdp_send");
  if (r.count > 0) ops::copy(ctx, host_copy_[read_].flat_range(r.offset, r.count), send);
  return send;
}

void OffloadedShards::refresh_device(Context& ctx) {
  // The master to each target in its own rounding: fp32 targets by a copy, the others through an
  // fp32 device chunk and the device's cast (what FSDP without offload sends, what
  // ParameterStore::refresh_lowp writes), one chunk at a time.
  const std::int64_t n = master_.numel();
  const std::int64_t step = std::min(kChunk, n);
  Tensor tmp;
  for (const Target& target : targets_)
    for (std::int64_t a = 0; a < target.count; a += step) {
      const std::int64_t c = std::min(step, target.count - a);
      Tensor src = master_.flat_range(target.offset + a, c), dst = target.dst.flat_range(a, c);
      if (dst.dtype() == DType::f32) {
        ops::copy(ctx, src, dst);
        if (target.also.defined()) {
          Tensor also_dst = target.also.flat_range(a, c);
          ops::cast(ctx, dst, also_dst);
        }
        continue;
      }
      if (!tmp.defined()) tmp = Tensor::empty({step}, DType::f32, *ctx.allocator, "offload_refresh");
      Tensor t = tmp.flat_range(0, c);
      ops::copy(ctx, src, t);
      ops::cast(ctx, t, dst);
    }
  rt_.synchronize();   // tmp is freed stream-ordered; the master may change on the host after this
  for (auto& f : copied_) f = {};
  stale_ = false;
}

void OffloadedShards::refresh_host() {
  // The master into the pinned host copy with the device cast's rounding (round to nearest even:
  // ops::cast on the host, core/dtype.h). The device may still be copying from the host copy
  // (an earlier gather's copy up, stream-ordered): wait for it before overwriting.
  // With the delayed update both buffers start from the master: the next step reads it, and a
  // resumed run continues from the saved master (not from the one before it).
  rt_.synchronize();
  for (Tensor& copy : host_copy_)
    if (copy.defined() && master_.numel() > 0) ops::cast(host_ctx_, master_, copy);
  for (auto& f : copied_) f = {};
  stale_ = false;
}

std::int64_t OffloadedShards::transfer_bytes_per_step() const {
  std::int64_t up = 0;   // pinned_host: none (each gather copies its unit up)
  for (const Target& t : targets_)
    up += t.count * static_cast<std::int64_t>(dtype_size(t.dst.dtype()) + (t.also.defined() ? dtype_size(compute_) : 0));
  return master_.numel() * 4 + up;
}

}  // namespace lmscale::parallel
