#pragma once
// Expert parallelism's row all-to-all over the GPUs' copy engines (parallel.ep_exchange =
// copy-engine, docs/moe.md), on one node. The MoE blocks' dispatch and combine, forward and
// backward, each move rows [rows, d] of the compute dtype between the ep ranks; NCCL's
// all_to_all_v runs them as kernels with a floor of ~150 us a call. Here the rows go by
// peer-to-peer copies into a receive window of each rank (comm/peer_copy.h) and no SM moves a
// byte; every rank knows every block's row counts on the host already (the counts all-to-all runs
// first, over MPI), so no count crosses on the device.
//
// The window holds one slot per other rank: slot i of rank j receives rank i's rows for j, at most
// slot_bytes at a time. A call's rows for one peer go as consecutive chunks of at most
// slot_bytes / row_bytes rows (one chunk for a training micro-batch, whose routed rows the slot
// is sized for: slot_rows(); an evaluation batch of grad_accum micro-batches takes several). Per
// ordered pair (i -> j) both sides count the chunks since the start: the sender what it put, the
// receiver what it read; both see the same row counts, hence the same chunks. Two flags per pair:
//   kPut (kept by j for i) = chunks i has put into its slot at j (signalled on i's copy lane after
//     the copy: the bytes land first);
//   kRead (kept by i for j) = chunks j has copied out of that slot (signalled from j's compute
//     stream after its copy).
// A call, on rank i, chunk round n = 0, 1, ... (a pair takes part in the rounds its rows fill):
//   1. on copy lane 0 (ordered after the compute stream's writes of `send` once per call), for
//      every peer j: wait kRead from j >= the chunks put to j so far (its slot is free), put the
//      n-th chunk of the rows for j, signal kPut to j;
//   2. on the compute stream, for every peer j: wait kPut from j >= the chunks read from j so
//      far + 1, copy the slot into recv's rows from j, signal kRead to j.
// This rank's own rows are a device-to-device copy on the compute stream. At the end the compute
// stream waits for lane 0 (the caller may free `send` once rows() returns). No host wait, no
// barrier. Deadlock-free: a round-n put needs only round n-1 reads, a round-n read only round-n
// puts; the lanes never wait on a compute stream's later work, and the kRead signals are not
// queued behind a lane.
//
// The rows are copied, not computed: recv holds the same bits as NCCL's all_to_all_v gives.
//
// Memory: peer_copy_window_bytes(ep, slot_bytes, 2) on every rank, from initialisation on, tag
// "ep_exchange_window" (what the memory model predicts: window_bytes()).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/peer_copy.h"
#include "lmscale/core/tensor.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::parallel {

class CopyEngineAllToAll {
 public:
  static constexpr int kPut = 0, kRead = 1, kFlags = 2;   // flags per sender (above)
  static constexpr const char* kTag = "ep_exchange_window";

  // host: an MPI communicator of the ep group's ranks, in the device group's order (IPC handles);
  // slot_bytes: the bytes one chunk of rows for one peer may take (>= one row). Collective over
  // host. Throws UsageError naming parallel.ep_exchange when the ranks are on several nodes or
  // their GPUs cannot map each other's memory (comm/peer_copy.h).
  CopyEngineAllToAll(comm::Communicator& host, std::size_t slot_bytes, ops::Runtime& rt);
  // Waits until every rank has read this rank's last chunks (their kRead signals land in this
  // rank's window, which is freed next); skipped while an exception unwinds.
  ~CopyEngineAllToAll();
  CopyEngineAllToAll(const CopyEngineAllToAll&) = delete;
  CopyEngineAllToAll& operator=(const CopyEngineAllToAll&) = delete;

  // model::ExpertParallelComm::rows: send [sum send_rows, d] in rank order to the ep ranks, recv
  // [sum recv_rows, d] from them in rank order; one dtype, on this GPU. Every rank of the group
  // calls it in the same order. Returns with the compute stream ordered after the exchange.
  void rows(const Tensor& send, const std::vector<std::int64_t>& send_rows, Tensor& recv,
            const std::vector<std::int64_t>& recv_rows);

  // The most rows one rank sends one peer in one call of a training micro-batch of `sequences`
  // sequences (of dims.context tokens): the micro-batch's routed rows N k (N = sequences x T),
  // fewer with a capacity (sequences x E x expert_capacity(T): docs/moe.md). The combine sends a
  // peer back the rows it received from it: the same bound.
  static std::int64_t slot_rows(const model::ModelDims& dims, std::int64_t sequences);
  // slot_rows x d_model x the compute dtype's bytes (element_bytes).
  static std::size_t slot_bytes(const model::ModelDims& dims, std::int64_t sequences, std::size_t element_bytes);
  // The window's bytes on every rank (what the tracker holds under kTag).
  static std::size_t window_bytes(int ranks, std::size_t slot_bytes) {
    return comm::peer_copy_window_bytes(ranks, slot_bytes, kFlags);
  }

 private:
  ops::Runtime& rt_;
  int rank_, size_;
  std::size_t slot_bytes_;
  std::unique_ptr<comm::PeerCopyExchange> exchange_;
  // [peer]: chunks put into its slot for this rank / read from this rank's slot for it, since the
  // start (the values of the kPut and kRead flags).
  std::vector<std::uint64_t> put_, read_;
};

}  // namespace lmscale::parallel
