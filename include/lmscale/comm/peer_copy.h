#pragma once
// Copy-engine transfers between the GPUs of one node (parallel.grad_exchange = copy-engine, and
// parallel.ep_exchange = copy-engine: parallel/copy_engine_all_to_all.h).
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
// A round (a training step's exchange) is ordered on the device by signals, with no host wait:
// signal(to, i, v, lane) writes v into flag i that rank `to` keeps for this rank, on the lane
// after the puts queued on it (the write is fenced: the bytes land first); wait(from, i, v,
// stream) holds `stream` until this rank's flag i from `from` is >= v (CUDA stream memory
// operations). Values only grow (a round number), so the flags never need resetting; drain(s)
// orders `s` after this rank's copies. When a slot may be rewritten is the caller's protocol:
//   zero2 opens each round with begin(), which waits for the reads recorded by the previous
//   round's consumed(s) and takes a host barrier (the host is far ahead of the GPU then);
//   bucketed DDP orders its rounds by the signals alone (parallel/copy_engine_all_reduce.h);
//   the ep all-to-all too, with the receiver signalling from its own stream that it has read a
//   slot (signal_after) and the sender's lane waiting for that before rewriting it (lane_wait).
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
  // The slot of this rank's window that `sender` (!= this rank) writes: a device pointer.
  virtual void* slot(int sender) = 0;
  // Host side: every rank's reads recorded by consumed() are done (host barrier); see above.
  virtual void begin() = 0;
  // Copies `bytes` from `src` (this GPU) to rank `to`: buffer kWindow is the slot rank `to` keeps
  // for this rank (offset within it), another id a buffer rank `to` shared (offset from its start).
  // On copy stream `lane` (0 or 1), ordered after the work queued so far on the cudaStream_t `after`;
  // `after` null: after the lane's earlier work alone (a caller that ordered the lane after its
  // stream with an earlier put of the same batch saves an event record and wait per copy).
  virtual void put(int to, int buffer, std::size_t offset, const void* src, std::size_t bytes, void* after,
                   int lane) = 0;
  void put(int to, std::size_t offset, const void* src, std::size_t bytes, void* after) {
    put(to, kWindow, offset, src, bytes, after, 0);
  }
  // The caller's reads of this rank's window are queued on `stream`: the next begin() waits for them.
  virtual void consumed(void* stream) = 0;
  // Collective: every rank's `base` (the start of one cudaMalloc allocation of `bytes` on its GPU,
  // e.g. a caching-allocator block) becomes a put() target of the others; returns its id.
  virtual int share(void* base, std::size_t bytes) = 0;
  // Device signals (see above); index < flags_per_sender.
  virtual void signal(int to, int index, std::uint64_t value, int lane) = 0;
  virtual void wait(int from, int index, std::uint64_t value, void* stream) = 0;
  // signal() written from the caller's cudaStream_t `stream` instead of a lane: after the work
  // queued on it so far (e.g. a receiver's copy out of its slot: "slot read"), never held behind
  // a lane's copies or waits.
  virtual void signal_after(int to, int index, std::uint64_t value, void* stream) = 0;
  // wait() held by copy stream `lane`: the lane's later copies start once this rank's flag
  // `index` from `from` is >= value (e.g. a slot is rewritten once its reader signalled), without
  // holding any caller stream.
  virtual void lane_wait(int from, int index, std::uint64_t value, int lane) = 0;
  // `stream` waits for everything queued on the copy lanes so far (no host wait); ends the round
  // begin() opened, if any.
  virtual void drain(void* stream) = 0;
};

// The bytes a rank's window takes: (size - 1) slots, then size x flags_per_sender 8-byte flags
// (at a multiple of 8). What the tracker counts and the memory model predicts.
inline std::size_t peer_copy_window_bytes(int size, std::size_t slot_bytes, int flags_per_sender) {
  const std::size_t slots = static_cast<std::size_t>(size - 1) * slot_bytes;
  return (slots + 7) / 8 * 8 + static_cast<std::size_t>(size) * static_cast<std::size_t>(flags_per_sender) * 8;
}

// Who asks for an exchange: the deck key named by its errors (with " = copy-engine" and the fix
// "use KEY = nccl"), the group its messages name, and the tracker's tag of its window.
struct PeerCopyUser {
  const char* key = "parallel.grad_exchange";
  const char* group = "data-parallel";
  const char* tag = "grad_exchange_window";
};

// host: an MpiCommunicator of the group's ranks for host data (handles, barriers). The window is
// allocated on the current CUDA device, peer_copy_window_bytes(...), counted in `tracker` under
// user.tag; its flags (flags_per_sender >= 1) start at 0. Collective over `host`. Throws
// UsageError naming user.key when the ranks are on different nodes or their GPUs cannot map each
// other's memory or run 64-bit stream memory operations; a build without CUDA always throws.
std::unique_ptr<PeerCopyExchange> make_peer_copy_exchange(Communicator& host, std::size_t slot_bytes,
                                                          MemoryTracker* tracker, int flags_per_sender,
                                                          const PeerCopyUser& user = {});

}  // namespace lmscale::comm
