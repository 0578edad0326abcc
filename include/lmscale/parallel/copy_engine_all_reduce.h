#pragma once
// Bucketed DDP's all-reduce over the GPUs' copy engines (parallel.grad_exchange = copy-engine with
// parallel.zero = none, parallel.ddp = bucketed), on one node. Issue 17: NCCL's all-reduce kernels
// hold SMs for the whole backward and slow its GEMMs; here no SM moves a byte and every transfer
// and sum runs while the backward goes on.
//
// Every bucket [offset, offset + numel) of the flat fp32 gradients is split into N consecutive
// parts (slice_of, as zero's even_split: rank q owns part q). When the backward has finished bucket b, on rank r:
//   1. scatter (copy lane 0): part q goes into rank q's receive window (slot r), for every q != r,
//      then rank q's flag "b scattered" from r is set to the round number;
// and for the bucket finished kLag buckets earlier (its parts have long landed by then):
//   2. sum (compute stream): once every rank's part r has arrived (flag waits on the device, no
//      host involvement), part r = the N ranks' parts added in rank order, written in place into
//      this rank's gradients;
//   3. gather (copy lane 1): the summed part r goes into every other rank's flat gradients at its
//      place (their buffers are shared through CUDA IPC), then the flag "b gathered" is set.
// The sums run on the compute stream between the backward's kernels, at full speed: on a
// low-priority side stream they lagged behind the backward, slowed it as much, and left most of
// their work after it (measured, docs/performance.md). complete() does steps 2-3 for the last kLag
// buckets, then makes the compute stream wait for the last bucket's gathers from every rank (each
// lane runs its buckets in order, and its flag writes are fenced) and for this rank's copies to
// have read its gradients. Every rank then holds the same sums bit for bit; with 2 ranks each
// element is one fp32 addition of the same two values, as NCCL's all-reduce makes it.
//
// No window is rewritten too early without a host barrier: rank q writes slot r of bucket b in
// round t + 1 only after its backward of t + 1, after its complete() of round t, which waited for
// rank r's gather of b in round t, which rank r queued after its sum of b had read the slot.
//
// Memory: the window holds (N - 1) slots of sum_b ceil(numel_b / N) fp32 elements, plus 2 x
// buckets flags per rank (window_bytes()).
//
// It is a backend of the gradient bucket reducer (parallel/bucket_reducer.h), which counts the
// ready gradients and calls launch(b) when bucket b is complete.
#include <cstdint>
#include <memory>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/peer_copy.h"
#include "lmscale/core/tensor.h"
#include "lmscale/parallel/bucket_reducer.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::parallel {

class CopyEngineAllReduce final : public BucketBackend {
 public:
  // host: an MPI communicator of the data-parallel ranks (IPC handles); grads: the flat fp32
  // gradients [P], the start of their allocation; buckets: over grads, as the backward completes
  // them. Collective over host.
  CopyEngineAllReduce(comm::Communicator& host, Tensor grads, std::vector<parallel::GradBucket> buckets,
                      ops::Runtime& rt);
  // A new round: the last micro-batch's backward is about to run.
  void begin_step() override;
  // The backward has queued the last gradient of bucket b on the compute stream.
  void launch(int b) override;
  // The compute stream waits until this round's sums are in this rank's gradients.
  void complete() override;

  // The window's bytes on every rank (what the tracker holds under "grad_exchange_window").
  static std::size_t window_bytes(const std::vector<parallel::GradBucket>& buckets, int ranks);

 private:
  struct Part {
    std::int64_t begin = 0, count = 0;   // elements of the flat gradients
  };
  Part part(int b, int q) const;
  void sum_and_gather(int b);
  static constexpr int kLag = 2;   // buckets between a bucket's scatter and its sum

  comm::Communicator& host_;
  Tensor grads_;
  std::vector<parallel::GradBucket> buckets_;
  ops::Runtime& rt_;
  int rank_, size_;
  // [rank q][bucket b]: where q's part of bucket b lies in the slots q keeps (elements).
  std::vector<std::vector<std::int64_t>> slot_at_;
  std::int64_t slot_at(int q, int b) const {
    return slot_at_[static_cast<std::size_t>(q)][static_cast<std::size_t>(b)];
  }
  std::unique_ptr<comm::PeerCopyExchange> exchange_;
  int grads_id_ = 0;                    // the shared gradients' buffer id in exchange_
  std::uint64_t round_ = 0;
  int last_ = -1;                        // the last bucket made ready this round
  std::vector<int> waiting_;             // scattered buckets not yet summed, in order
};

}  // namespace lmscale::parallel
