#pragma once
// parallel.offload = optimizer (+params) (docs/parallel.md "CPU offload"): a rank's flat shard [S]
// of fp32 master weights and its AdamW moments m, v live in host memory, and a worker thread
// updates them on the host while the GPU goes on. The shard is what the rank owns: FSDP's
// parameter shard, ZeRO-1/2's range of the flat buffer, or the whole store of one process.
//
// Targets (one process, zero1/zero2): instead of a device copy of its own, the caller names
// where each piece of the shard lives on the device in the dtype the forward reads (the store's
// working copy, or its fp32 weights: under fp32, and the norm weights under mixed precision);
// the worker's copy up writes there. Without targets the object allocates the device copy [S].
//
// The device keeps only what the forward and backward need: the gradient shard (fp32 [S], where
// the reduce-scatters add) and a copy of the master in the compute dtype (bf16/fp16 [S], or fp32),
// which is what the all-gathers send, so no cast runs before a gather. Per step, after the
// gradient norm is known (the clip factor is part of grad_scale):
//
//   start_step()  returns at once; the worker walks the shard in chunks of <= kChunk elements, in
//                 forward (unit) order, through two pinned staging slots:
//     D2H  gradient chunk c+1 -> pinned slot      (the lane's copy stream, during c's update)
//     host AdamW of chunk c on master, m, v (ops::adamw_host, the device kernel's arithmetic:
//                 bitwise what parallel.offload = none computes), writing the compute-dtype copy
//                 into a pinned slot
//     H2D  that slot -> the device copy of chunk c
//   device_shard(u) is called before unit u's gather (the next forward): the host waits until the
//                 worker has queued u's last chunk, and the compute stream waits for its copy.
//                 So the forward of unit u overlaps the host update of units u+1, u+2, ...
//
// Memory: host 12 bytes per shard element (master, m, v; pageable: only the staging slots are
// pinned), device 4 + 2 bytes (gradient shard + bf16 copy) instead of 16 (+ fp32 master, m, v).
// Bytes over the bus per step and element: 4 (gradients down) + 2 (bf16 copy up).
//
// parallel.offload = optimizer+params (ShardCopy::pinned_host): no device copy. The worker writes
// each chunk's compute-dtype result straight into a pinned host copy [S] (no H2D), and
// device_shard(u) waits on the host for u's last chunk, then copies u's range of the host copy
// into a fresh device buffer [count] from ctx's allocator on ctx's stream (asynchronous from
// pinned memory), which the caller keeps until its gather is done (FSDP's Gathered::send). The
// copy runs on the compute stream right before the gather: a prefetch of the copies on a side
// stream is not built. Device: the gradient shard and the units' send buffers in flight; host
// 12 + e bytes per element; bus: 4 per element per step down, e per element per gather up.
// The host copy is rewritten by the next step's worker only after it has waited for the step's
// gradients (its lane fence follows the compute stream's point at start_step(), after every
// gather's copy of the step); a refresh from the master synchronises the device first.
//
// The one-step-delayed update (ZeRO-Offload's "DPU", parallel.offload_delayed_update; pinned_host
// only): the forward and backward of step s + 1 do not wait for step s's host update but read the
// parameters of step s - 1, so the whole host update of step s overlaps step s + 1's forward and
// backward on the GPU. Step s + 1's gradients are therefore taken at the parameters of step s - 1
// and applied on top of step s's: the numerics change (docs/parallel.md). Two pinned host copies
// [S]: the gathers read one (the previous update's result) while the worker writes the other;
// start_step() first waits for the update in flight, then swaps them. The worker writes the
// buffer the step's gathers read only after the step's point on the compute stream (as below),
// so no gather reads a half-written copy.
//
// Ordering: the worker's copies of chunk c start after the compute stream's point where
// start_step() was called (the gradients are final); the next backward overwrites the gradient
// shard only after every unit's forward, which waited for every chunk's copy back, so a step can
// never read gradients of the next. settle() waits for the step in flight (checkpoints, the
// destructor); the master and moments must not be read or written while a step is in flight.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "lmscale/io/config.h"
#include "lmscale/ops/host_transfer.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/optim/host_adamw.h"

namespace lmscale::parallel {

class OffloadedShards {
 public:
  struct Range {
    std::int64_t offset = 0, count = 0;   // a unit's shard within the flat shard [S]
  };
  // Where the compute-dtype copy of the shard lives: device (parallel.offload = optimizer) or
  // pinned host memory (optimizer+params).
  enum class ShardCopy { device, pinned_host };
  // Elements [offset, offset + count) of the shard go to `dst` (device, [count], the compute
  // dtype or fp32) after each step.
  struct Target {
    std::int64_t offset = 0, count = 0;
    Tensor dst;
    // An fp32 target may also refresh a compute-dtype copy of the same elements (the working
    // copy's entries of weights the forward reads in fp32, e.g. the norms): the rounding the
    // device cast gives, so the working copy stays the cast of the master everywhere.
    Tensor also;
  };
  // numel: S; units: each unit's range, in forward order, disjoint; compute: the dtype of the
  // shard's copy; threads: host threads of the AdamW; chunk: elements per pipelined piece.
  // delayed_update: the one-step-delayed update above (ShardCopy::pinned_host only).
  OffloadedShards(ops::Runtime& rt, std::int64_t numel, std::vector<Range> units, DType compute,
                  const OptimConfig& cfg, int threads, ShardCopy copy = ShardCopy::device,
                  std::int64_t chunk = kChunk, bool delayed_update = false);
  // ShardCopy::device into the caller's targets (ascending, disjoint, covering [0, S)); chunks
  // end at target boundaries too.
  OffloadedShards(ops::Runtime& rt, std::int64_t numel, std::vector<Range> units, std::vector<Target> targets,
                  DType compute, const OptimConfig& cfg, int threads, std::int64_t chunk = kChunk);
  ~OffloadedShards();   // waits for the worker; never throws
  OffloadedShards(const OffloadedShards&) = delete;
  OffloadedShards& operator=(const OffloadedShards&) = delete;

  // Host fp32 [S]: initial values, checkpoints. Settle first; call mark_master_changed() after
  // writing it.
  Tensor& master() { return master_; }
  // m and v (host, [S]) and the step count.
  optim::HostAdamW& optimizer() { return *optimizer_; }
  // The shard's copy must be rebuilt from the master before the next gather.
  void mark_master_changed() { stale_ = true; }
  // The caller's targets already hold the master in their rounding (both were set from the same
  // initial values): no rebuild (and none of its device staging) before the first step.
  void mark_targets_current() { stale_ = false; }

  // Unit u's shard [count] in the compute dtype on the device, ready on ctx's stream (see the
  // header): a view of the device copy, or (pinned_host) a new buffer from ctx's allocator that
  // the caller must keep until the stream has read it. With the delayed update: the previous
  // update's result, at once (no wait for the update in flight).
  // (Without targets.)
  Tensor device_shard(Context& ctx, int u);
  // Makes ctx's stream wait until unit u's targets hold the step's result (the host waits until
  // the worker has queued u's last copy up); rebuilds the targets first after a master change.
  void wait_unit(Context& ctx, int u);
  int units() const { return static_cast<int>(units_.size()); }
  // One AdamW step over the whole shard: begin_step() here, the update on the worker.
  // grads: device fp32 [S], final at ctx's stream's current point.
  void start_step(Context& ctx, const Tensor& grads, double lr, double grad_scale);
  // The same with the gradients in pieces (offsets in the shard, ascending, disjoint, covering
  // it; one process's lazy buckets), which must stay alive until every unit was waited for.
  void start_step(Context& ctx, std::vector<ops::GradPiece> grads, double lr, double grad_scale);
  // Waits for the step in flight, rethrowing its error.
  void settle();

  // Test seam: the worker calls f(u) before it updates unit u's first chunk (units without
  // elements here are skipped), e.g. to hold the update of the later units while a test checks
  // what the earlier ones allow. Set while no step is in flight.
  void set_before_unit(std::function<void(int unit)> f) { before_unit_ = std::move(f); }

  // Bytes the step moves between host and device (pinned_host: the gradients only; each gather
  // adds its unit's copy).
  std::int64_t transfer_bytes_per_step() const;

  static constexpr std::int64_t kChunk = std::int64_t{1} << 25;   // 32 Mi elements: 128 MiB of fp32 gradients

 private:
  struct Chunk {
    std::int64_t offset = 0, count = 0;
    std::size_t target = 0;   // the target holding it (ShardCopy::device)
    int unit = 0;
  };
  void init(std::vector<Range> units, std::int64_t chunk);
  void run_worker();
  void update(const std::vector<ops::GradPiece>& grads, double lr, double grad_scale,
              const ops::HostTransfer::Fence& ready);
  void refresh_device(Context& ctx);
  void refresh_host();
  void refresh(Context& ctx) { copy_ == ShardCopy::device ? refresh_device(ctx) : refresh_host(); }

  ops::Runtime& rt_;
  Context host_ctx_;
  DType compute_;
  int threads_;
  ShardCopy copy_;
  std::vector<Range> units_;
  std::vector<Target> targets_;           // ShardCopy::device: the caller's, or one per unit of device_copy_
  std::vector<Chunk> chunks_;
  static constexpr std::size_t kNoChunk = static_cast<std::size_t>(-1);
  std::vector<std::size_t> last_chunk_;   // per unit: its last chunk's index (kNoChunk if empty)
  std::unique_ptr<optim::HostAdamW> optimizer_;
  // Before the tensors it allocates (host_copy_, the slots): members are destroyed in reverse
  // order, and a pinned tensor frees through the lane's allocator.
  std::unique_ptr<ops::HostTransfer> lane_;
  Tensor master_;                          // host fp32 [S]
  Tensor device_copy_;                     // device [S], compute dtype (ShardCopy::device without targets)
  // pinned host [S], compute dtype (ShardCopy::pinned_host): [read_] is what the gathers copy up,
  // [write_] what the worker writes; the same buffer but with the delayed update.
  Tensor host_copy_[2];
  bool delayed_ = false;
  int read_ = 0, write_ = 0;
  // pinned [largest chunk]: fp32 gradients, and (ShardCopy::device) the parameters in the
  // widest target dtype, viewed in each chunk's target dtype
  Tensor grad_slot_[2], copy_slot_[2];
  Tensor also_slot_[2];                    // pinned [largest chunk of a target with `also`], compute dtype
  bool stale_ = true;
  std::function<void(int)> before_unit_;   // set_before_unit (tests)

  // Between the caller and the worker, under mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, job_ = false;        // job_: a step was handed over and not yet taken
  bool in_flight_ = false;                 // a step was started and its last chunk is not done
  std::size_t done_ = 0;                   // chunks of the step in flight whose copy back is queued
  std::vector<ops::HostTransfer::Fence> copied_;   // per chunk: its copy back to the device
  std::vector<ops::GradPiece> job_grads_;   // the worker's: non-owning views of held_grads_
  // The step's gradient pieces as the caller handed them (owning: a lazy bucket stays allocated
  // while a handle lives). The main thread lets go of each piece once the worker has copied every
  // chunk it overlaps down (wait_unit, settle), so a bucket the strategy released goes back to
  // the allocator while the update goes on; holding them all to the next step cost one more set
  // of gradients on the device (7.1 GiB for xl on one GPU).
  std::vector<ops::GradPiece> held_grads_;
  std::int64_t copied_down_ = 0;             // shard elements [0, copied_down_) are on the host
  void let_go_of_copied_grads();             // main thread
  double job_lr_ = 0, job_scale_ = 1;
  ops::HostTransfer::Fence job_ready_;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace lmscale::parallel
