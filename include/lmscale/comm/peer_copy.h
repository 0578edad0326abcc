#pragma once
// Copy-engine transfers between the GPUs of one node (parallel.grad_exchange = copy-engine).
//
// Every rank of a group exposes a receive window in its GPU memory through CUDA IPC: one slot of
// slot_bytes per other rank. A rank puts bytes into another rank's slot with a peer-to-peer
// cudaMemcpyAsync on a copy stream of its own, so the GPU's copy engines move them over NVLink
// (or PCIe) and no SM runs a kernel for them. NCCL's collectives, by contrast, run as kernels
// that hold SMs for as long as they move data: during the backward they take SMs from the GEMMs
// (docs/performance.md, issue 17). What NCCL would compute on the way (a sum) is left to the
// caller, after complete().
//
// One round (a training step's exchange), on every rank of the group, in this order:
//   begin()        every rank has finished reading its window in the previous round (host
//                  barrier), so the slots may be written again;
//   put(...)       any number, each ordered after the work queued so far on `after`;
//   complete(s)    this rank's puts are done (the host waits for its copy stream), then a host
//                  barrier: every slot of this rank's window holds this round's bytes; `s` is
//                  ordered after the puts, so their sources may be freed by work on `s`;
//   consumed(s)    the caller's reads of the window are queued on `s`: the next begin() waits for
//                  them before it lets any rank write again.
// The barriers are on the host: a round costs two MPI barriers and one host wait for the copy
// stream. The group must be on one node (checked: MpiCommunicator::node_local) with peer
// access between its GPUs (cudaIpcOpenMemHandle fails otherwise; the error names the key).
#include <cstddef>
#include <memory>

#include "lmscale/comm/communicator.h"
#include "lmscale/core/memory_tracker.h"

namespace lmscale::comm {

class PeerCopyExchange {
 public:
  virtual ~PeerCopyExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::size_t slot_bytes() const = 0;
  // The slot of this rank's window that `sender` (!= rank()) writes: a device pointer.
  virtual void* slot(int sender) = 0;
  virtual void begin() = 0;
  // Copies `bytes` from `src` (this GPU) to byte `offset` of the slot rank `to` keeps for this
  // rank; ordered after the work queued so far on the cudaStream_t `after`.
  virtual void put(int to, std::size_t offset, const void* src, std::size_t bytes, void* after) = 0;
  virtual void complete(void* stream) = 0;
  virtual void consumed(void* stream) = 0;
};

// host: an MpiCommunicator of the group's ranks for host data (handles, barriers). The window is
// allocated on the current CUDA device, (size - 1) x slot_bytes, counted in `tracker` under the
// tag "grad_exchange_window". Collective over `host`. Throws UsageError naming
// parallel.grad_exchange when the ranks are on different nodes or their GPUs cannot map each
// other's memory; a build without CUDA always throws.
std::unique_ptr<PeerCopyExchange> make_peer_copy_exchange(Communicator& host, std::size_t slot_bytes,
                                                          MemoryTracker* tracker);

}  // namespace lmscale::comm
