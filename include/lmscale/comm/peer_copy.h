#pragma once
// Copy-engine transfers between the GPUs of one node (parallel.grad_exchange = copy-engine).
//
// Every rank of a group exposes a receive window in its GPU memory through CUDA IPC: one slot of
// slot_bytes per other rank, then (when asked for) an array of signal flags per other rank. A rank
// puts bytes into another rank's slot, or into a buffer that rank shared (share()), with a
// peer-to-peer cudaMemcpyAsync on a copy stream of its own ("lane"), so the GPU's copy engines move
// them over NVLink (or PCIe) and no SM runs a kernel for them. NCCL's collectives, by contrast, run
// as kernels that hold SMs for as long as they move data: during the backward they take SMs from
// the GEMMs (docs/performance.md, issue 17). What NCCL would compute on the way (a sum) is left to
// the caller.
//
// Two ways to order a round (a training step's exchange):
// 1. Host barriers (zero2), on every rank of the group, in this order:
//   begin()        every rank has finished reading its window in the previous round (host
//                  barrier), so the slots may be written again;
//   put(...)       any number, each ordered after the work queued so far on `after`;
//   complete(s)    this rank's puts are done (the host waits for its copy lanes), then a host
//                  barrier: every slot of this rank's window holds this round's bytes; `s` is
//                  ordered after the puts, so their sources may be freed by work on `s`;
//   consumed(s)    the caller's reads of the window are queued on `s`: the next begin() waits for
//                  them before it lets any rank write again.
//   A round costs two MPI barriers and one host wait for the copy lanes.
// 2. Device signals, no host wait: signal(to, i, v, lane) writes v into flag i that rank `to`
//   keeps for this rank, on the lane after the puts queued on it (the write is fenced: the bytes
//   land first); wait(from, i, v, stream) holds `stream` until this rank's flag i from `from` is
//   >= v (CUDA stream memory operations). Values only grow (a round number), so the flags never
//   need resetting. When a slot may be rewritten is the caller's protocol: zero2 keeps begin()'s
//   host barrier and ends a round with drain() instead of complete(); bucketed DDP orders its
//   rounds by the signals alone (parallel/copy_engine_all_reduce.h).
// The group must be on one node (checked: MpiCommunicator::node_local) with peer access between
// its GPUs (cudaIpcOpenMemHandle fails otherwise; the error names the key).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "lmscale/comm/communicator.h"
#include "lmscale/core/memory_tracker.h"

namespace lmscale::comm {

class PeerCopyExchange {
 public:
  static constexpr int kWindow = 0;   // the buffer id of the receive window (share() gives others)
  virtual ~PeerCopyExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::size_t slot_bytes() const = 0;
  // The slot of this rank's window that `sender` (!= rank()) writes: a device pointer.
  virtual void* slot(int sender) = 0;
  virtual void begin() = 0;
  // Copies `bytes` from `src` (this GPU) to rank `to`: buffer kWindow is the slot rank `to` keeps
  // for this rank (offset within it), another id a buffer rank `to` shared (offset from its start).
  // On copy stream `lane` (0 or 1), ordered after the work queued so far on the cudaStream_t `after`.
  virtual void put(int to, int buffer, std::size_t offset, const void* src, std::size_t bytes, void* after,
                   int lane) = 0;
  void put(int to, std::size_t offset, const void* src, std::size_t bytes, void* after) {
    put(to, kWindow, offset, src, bytes, after, 0);
  }
  virtual void complete(void* stream) = 0;
  virtual void consumed(void* stream) = 0;
  // Collective: every rank's `base` (the start of one cudaMalloc allocation of `bytes` on its GPU,
  // e.g. a caching-allocator block) becomes a put() target of the others; returns its id.
  virtual int share(void* base, std::size_t bytes) = 0;
  // Device signals (see above); index < flags_per_sender.
  virtual void signal(int to, int index, std::uint64_t value, int lane) = 0;
  virtual void wait(int from, int index, std::uint64_t value, void* stream) = 0;
  // `stream` waits for everything queued on the copy lanes so far (no host wait); ends the round
  // begin() opened, if any.
  virtual void drain(void* stream) = 0;
};

// The bytes a rank's window takes: (size - 1) slots, then size x flags_per_sender 8-byte flags
// (at a multiple of 8). What the tracker counts and the memory model predicts.
inline std::size_t peer_copy_window_bytes(int size, std::size_t slot_bytes, int flags_per_sender) {
  const std::size_t slots = static_cast<std::size_t>(size - 1) * slot_bytes;
  if (flags_per_sender <= 0) return slots;
  return (slots + 7) / 8 * 8 + static_cast<std::size_t>(size) * static_cast<std::size_t>(flags_per_sender) * 8;
}

// host: an MpiCommunicator of the group's ranks for host data (handles, barriers). The window is
// allocated on the current CUDA device, peer_copy_window_bytes(...), counted in `tracker` under the
// tag "grad_exchange_window"; its flags start at 0. Collective over `host`. Throws UsageError
// naming parallel.grad_exchange when the ranks are on different nodes or their GPUs cannot map
// each other's memory (or, with flags, cannot run 64-bit stream memory operations); a build
// without CUDA always throws.
std::unique_ptr<PeerCopyExchange> make_peer_copy_exchange(Communicator& host, std::size_t slot_bytes,
                                                          MemoryTracker* tracker, int flags_per_sender = 0);

}  // namespace lmscale::comm
