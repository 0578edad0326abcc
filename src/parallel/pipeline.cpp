#include "lmscale/parallel/pipeline.h"

#include <algorithm>
#include <deque>
#include <map>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/parallel/interleaved_schedule.h"
#include "lmscale/parallel/spec.h"

namespace lmscale::parallel {

double theory_bubble_fraction(int stages, int microbatches, int virtual_stages) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1) /
         static_cast<double>(virtual_stages);
}

double zero_bubble_fraction(int stages, int microbatches, double f, double b, double w) {
  const double idle = pipeline_idle(PipelineSchedule::zb_h1, stages, microbatches, 1, f, b, w);
  return idle / (idle + microbatches * (f + b + w));
}

TheoryBubble schedule_theory_bubble(PipelineSchedule schedule, int stages, int microbatches, int virtual_stages) {
  switch (schedule) {
    case PipelineSchedule::zb_h1:
      return {zero_bubble_fraction(stages, microbatches, 1, 1, 1), "of zb-h1 with f = b = w"};
    case PipelineSchedule::interleaved:
      return {theory_bubble_fraction(stages, microbatches, virtual_stages), "(p-1)/(m+p-1)/v"};
    case PipelineSchedule::gpipe:
    case PipelineSchedule::one_f_one_b: break;
  }
  return {theory_bubble_fraction(stages, microbatches), "(p-1)/(m+p-1)"};
}

namespace {
// Tags of the two directions (the mpi backend matches by tag; nccl by order).
constexpr int kForwardTag = 1, kBackwardTag = 2;
}  // namespace

struct PipelineParallel::Slot {
  std::unique_ptr<model::Activations> act;
};

const model::ParallelContext& PipelineParallel::hooks_for(GradientSync& sync, int micro, int micro_count) {
  // Taken from the strategy once per microbatch and step, then shared: by the head chunk's
  // forward (whose head unit runs its backward) and its backward, and under the interleaved
  // schedule by the backwards of all V chunks, which together are microbatch m's backward. A
  // strategy arms its gradient reduction when it hands out the last microbatch's hooks (the
  // bucket reducer's counters of DDP and ZeRO-2, parallel/bucket_reducer.h); asking again per
  // chunk would re-arm it halfway.
  auto it = hooks_.find(micro);
  if (it == hooks_.end()) it = hooks_.emplace(micro, with_tp(sync.hooks(micro, micro_count))).first;
  return it->second;
}

PipelineParallel::PipelineParallel(std::vector<model::TransformerLM*> chunks, comm::Communicator& pp,
                                   ops::Runtime& rt, PipeSchedule schedule, model::TensorParallelComm tp)
    : chunks_(std::move(chunks)), pp_(pp), rt_(rt), schedule_(schedule), stage_(pp.rank()), stages_(pp.size()),
      d_(chunks_.front()->dims().d_model), act_dtype_(chunks_.front()->params().lowp_dtype()),
      split_(chunks_.front()->params().tensor_split()), tp_(std::move(tp)) {
  LMSCALE_CHECK(schedule == PipeSchedule::interleaved || chunks_.size() == 1, "{} chunks for the {} schedule",
                chunks_.size(), schedule);
  LMSCALE_CHECK(!split_.active() || static_cast<bool>(tp_.sum),
                "pipeline stages with tensor parallelism (tp = {}) need the tp callbacks", split_.degree);
}

model::ParallelContext PipelineParallel::with_tp(model::ParallelContext pc) const {
  if (split_.active()) pc.tp = tp_;
  return pc;
}

std::int64_t PipelineParallel::transfer_rows(std::int64_t N) const {
  // Sequence parallel: this tp rank's row shard of the residual stream (the stage's output
  // under sp; no gather at the boundary). Otherwise the [N,d] replicated on the tp ranks, each
  // sending its copy to the same tp rank of the next stage.
  return split_.sequence_sharded() ? N / split_.degree : N;
}

void PipelineParallel::keep_send(comm::Work w, Tensor buf) { sends_.emplace_back(std::move(w), std::move(buf)); }

Tensor PipelineParallel::recv_activation(std::int64_t rows) {
  // Activations (forward) and their gradients (backward) are both [rows, d] in the compute dtype.
  return Tensor::empty({rows, d_}, act_dtype_, *rt_.ctx().allocator, "pipeline_recv");
}

void PipelineParallel::forward(int m, Slot& slot, const Tensor& input, const Tensor& targets, std::int64_t T,
                               double grad_scale, std::vector<Tensor>& loss_sums, bool accumulate, GradientSync& sync,
                               int micro_offset, int micro_count, int chunk) {
  NvtxRange r("pipeline_forward");
  const std::int64_t B = targets.dim(0);
  model::TransformerLM& model = *chunks_[static_cast<std::size_t>(chunk)];
  const bool head = model.units().owns_head(model.dims());
  RawEvent e{m, false, chunk, rt_.mark(), {}};
  // Microbatches run forward in order 0..M-1 too, so the head's gradients accumulate in the
  // order of a single process's micro-batches.
  // The strategy's forward hooks (fsdp gathers each unit ahead of use), taken before the
  // microbatch's backward hooks (fsdp: forward hooks close a step left open, backward hooks open
  // this one); the head chunk's forward runs its head unit's backward, so it gets both.
  model::ParallelContext pc = with_tp(sync.forward_hooks(true));
  if (head) {
    const model::ParallelContext& b = hooks_for(sync, micro_offset + m, micro_count);
    pc.on_grad_ready = b.on_grad_ready;
    pc.before_backward = b.before_backward;
    pc.after_backward = b.after_backward;
  }
  slot.act = model.forward_stage(rt_.ctx(), input, targets, B, T, true, grad_scale, pc, accumulate || m > 0);
  e.end = rt_.mark();
  raw_.push_back(std::move(e));
  if (model.units().owns_head(model.dims())) loss_sums.push_back(slot.act->loss_sum);
}

Tensor PipelineParallel::backward(int m, Slot& slot, Tensor dy, bool accumulate, GradientSync& sync,
                                  int micro_offset, int micro_count, int chunk) {
  NvtxRange r("pipeline_backward");
  // Earlier sends are complete in the schedule's logic by now (the gradient that starts this
  // backward came after the neighbour consumed them); waiting releases their buffers.
  for (auto& s : sends_) s.first.wait();
  sends_.clear();
  RawEvent e{m, true, chunk, rt_.mark(), {}};
  // Each chunk's parameters are touched only by that chunk's backwards, which run in
  // microbatch order 0..M-1: microbatch 0 overwrites its gradients.
  model::TransformerLM& model = *chunks_[static_cast<std::size_t>(chunk)];
  const bool defer = schedule_ == PipeSchedule::zb_h1;
  Tensor dx = model.backward_stage(rt_.ctx(), *slot.act, std::move(dy),
                                   hooks_for(sync, micro_offset + m, micro_count),
                                   accumulate || m > 0, defer);
  e.end = rt_.mark();
  raw_.push_back(std::move(e));
  if (defer) weights_.push_back({m, std::move(slot.act->weight_work)});
  slot.act.reset();
  return dx;
}

void PipelineParallel::weight_pass(GradientSync& sync, int micro_offset, int micro_count) {
  if (weights_.empty()) return;
  NvtxRange r("pipeline_weights");
  PendingWeights w = std::move(weights_.front());
  weights_.pop_front();
  RawEvent e{w.micro, true, 0, rt_.mark(), {}, true};
  chunks_.front()->backward_weights(rt_.ctx(), w.work, hooks_for(sync, micro_offset + w.micro, micro_count));
  e.end = rt_.mark();
  raw_.push_back(std::move(e));
}

void PipelineParallel::run(const std::vector<Tensor>& tokens, const std::vector<Tensor>& targets, std::int64_t T,
                           double grad_scale, bool accumulate, GradientSync& sync, int micro_offset, int micro_count,
                           std::vector<Tensor>& loss_sums) {
  NvtxRange range("pipeline");
  if (micro_offset == 0) hooks_.clear();
  if (schedule_ == PipeSchedule::interleaved) {
    if (micro_offset == 0) {
      start_ = rt_.mark();
      raw_.clear();
    }
    return run_interleaved(tokens, targets, T, grad_scale, accumulate, sync, micro_count, loss_sums);
  }
  const int M = static_cast<int>(targets.size());
  LMSCALE_CHECK(M >= 1 && tokens.size() == targets.size(), "pipeline: {} token and {} target microbatches",
                tokens.size(), targets.size());
  const std::int64_t rows = transfer_rows(targets[0].dim(0) * T);   // of every transfer
  const int prev = stage_ - 1, next = stage_ + 1;
  if (micro_offset == 0) {
    start_ = rt_.mark();
    raw_.clear();
  }
  std::vector<Slot> slots(static_cast<std::size_t>(M));
  auto in_of = [&](int m) { return is_first() ? tokens[static_cast<std::size_t>(m)] : recv_activation(rows); };
  auto recv_from = [&](Tensor buf, int peer) {
    pp_.recv(buf, peer).wait();
    return buf;
  };
  auto output_of = [&](int m) {
    Slot& s = slots[static_cast<std::size_t>(m)];
    Tensor out = s.act->output;
    s.act->output = Tensor();
    return out;
  };
  const int warmup = schedule_ == PipeSchedule::gpipe ? M : std::min(stages_ - stage_ - 1, M);
  const int steady = M - warmup;
  int f = 0, b = 0;   // next microbatch to run forward / backward (both in order 0..M-1)

  // Warm-up: forwards only (gpipe: all of them).
  for (int i = 0; i < warmup; ++i, ++f) {
    Tensor in = is_first() ? tokens[static_cast<std::size_t>(f)] : recv_from(in_of(f), prev);
    forward(f, slots[static_cast<std::size_t>(f)], in, targets[static_cast<std::size_t>(f)], T, grad_scale, loss_sums,
            accumulate, sync, micro_offset, micro_count);
    if (!is_last()) {
      Tensor out = output_of(f);
      keep_send(pp_.send(out, next, 0, comm::async_call()), out);
    }
  }
  // Steady 1F1B: forward f, then backward b; transfers paired with the neighbours' (Megatron).
  Tensor in;
  if (steady > 0) in = is_first() ? tokens[static_cast<std::size_t>(f)] : recv_from(in_of(f), prev);
  for (int i = 0; i < steady; ++i, ++f, ++b) {
    forward(f, slots[static_cast<std::size_t>(f)], in, targets[static_cast<std::size_t>(f)], T, grad_scale, loss_sums,
            accumulate, sync, micro_offset, micro_count);
    Tensor dy;
    if (!is_last()) {
      // Send this forward's output, receive the gradient of microbatch b's output.
      Tensor out = output_of(f);
      dy = recv_activation(rows);
      comm::Work w = pp_.sendrecv(out.data(), static_cast<std::size_t>(out.numel()), next, dy.data(),
                                  static_cast<std::size_t>(dy.numel()), next, act_dtype_, 0, comm::async_call());
      w.wait();
      keep_send(w, out);
    }
    Tensor dx = backward(b, slots[static_cast<std::size_t>(b)], dy, accumulate, sync, micro_offset, micro_count);
    const bool last_steady = i + 1 == steady;
    const bool weights_due = b >= stage_;   // zb-h1: stage s runs W(b - s) here
    if (is_first()) {
      if (!last_steady) in = tokens[static_cast<std::size_t>(f + 1)];
    } else if (last_steady) {
      keep_send(pp_.send(dx, prev, 0, comm::async_call()), dx);
    } else {
      // Send microbatch b's input gradient, receive microbatch f+1's input activation.
      in = recv_activation(rows);
      comm::Work w = pp_.sendrecv(dx.data(), static_cast<std::size_t>(dx.numel()), prev, in.data(),
                                  static_cast<std::size_t>(in.numel()), prev, act_dtype_, 0, comm::async_call());
      w.wait();
      keep_send(w, dx);
    }
    if (weights_due) weight_pass(sync, micro_offset, micro_count);
  }
  // Cool-down: the remaining backwards (gpipe: all of them).
  for (; b < M; ++b) {
    Tensor dy = is_last() ? Tensor() : recv_from(recv_activation(rows), next);
    Tensor dx = backward(b, slots[static_cast<std::size_t>(b)], dy, accumulate, sync, micro_offset, micro_count);
    if (!is_first()) keep_send(pp_.send(dx, prev, 0, comm::async_call()), dx);
    weight_pass(sync, micro_offset, micro_count);   // zb-h1: fills the wait for the next gradient
  }
  while (!weights_.empty()) weight_pass(sync, micro_offset, micro_count);
  for (auto& s : sends_) s.first.wait();
  sends_.clear();
}

Tensor PipelineParallel::forward_only(const Tensor& tokens, const Tensor& targets, std::int64_t T,
                                     const model::ParallelContext& hooks) {
  // Virtual stage k = c * p + s (chunk c of rank s) feeds k + 1: around the ring for each chunk.
  const std::int64_t rows = transfer_rows(targets.dim(0) * T);
  const int p = stages_, next = (stage_ + 1) % p, prev = (stage_ + p - 1) % p;
  Tensor loss;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    model::TransformerLM& model = *chunks_[c];
    Tensor in = tokens;
    if (!model.units().owns_embedding()) {
      in = recv_activation(rows);
      pp_.recv(in, prev, kForwardTag).wait();
    }
    auto act = model.forward_stage(rt_.ctx(), in, targets, targets.dim(0), T, false, 1.0, with_tp(hooks));
    if (model.units().owns_head(model.dims())) loss = act->loss_sum;
    else pp_.send(act->output, next, kForwardTag).wait();
  }
  return loss;
}

void PipelineParallel::run_interleaved(const std::vector<Tensor>& tokens, const std::vector<Tensor>& targets,
                                       std::int64_t T, double grad_scale, bool accumulate, GradientSync& sync,
                                       int micro_count, std::vector<Tensor>& loss_sums) {
  // Megatron-LM's forward_backward_pipelining_with_interleaving, as the plan of
  // parallel/interleaved_schedule.h lays it out: "k" counts the rank's chunk-microbatches (M*V
  // forwards, M*V backwards). Received tensors queue per chunk in the order they are used.
  const int p = stages_, V = static_cast<int>(chunks_.size()), M = static_cast<int>(targets.size());
  const std::int64_t rows = transfer_rows(targets[0].dim(0) * T);
  const int next = (stage_ + 1) % p, prev = (stage_ + p - 1) % p;
  auto first_virtual = [&](int c) { return stage_ == 0 && c == 0; };
  auto last_virtual = [&](int c) { return stage_ == p - 1 && c == V - 1; };
  std::vector<std::deque<Tensor>> inputs(static_cast<std::size_t>(V)), grads(static_cast<std::size_t>(V));
  std::vector<std::vector<Slot>> slots(static_cast<std::size_t>(V));
  for (auto& v : slots) v.resize(static_cast<std::size_t>(M));
  std::map<int, Tensor> outputs, input_grads;   // by k: produced, not yet sent
  auto pop = [](std::deque<Tensor>& q) {
    LMSCALE_CHECK(!q.empty(), "interleaved schedule: no tensor received for this step");
    Tensor t = q.front();
    q.pop_front();
    return t;
  };
  auto take = [](std::map<int, Tensor>& m, int k) {
    auto it = m.find(k);
    LMSCALE_CHECK(it != m.end(), "interleaved schedule: nothing to send for chunk-microbatch {}", k);
    Tensor t = it->second;
    m.erase(it);
    return t;
  };
  for (const InterleavedStep& st : interleaved_plan(p, V, M, stage_)) {
    if (st.kind == InterleavedStep::Kind::forward) {
      const int c = interleaved_forward_chunk(st.k, p, V), m = interleaved_microbatch(st.k, p, V);
      Slot& slot = slots[static_cast<std::size_t>(c)][static_cast<std::size_t>(m)];
      const Tensor in =
          first_virtual(c) ? tokens[static_cast<std::size_t>(m)] : pop(inputs[static_cast<std::size_t>(c)]);
      forward(m, slot, in, targets[static_cast<std::size_t>(m)], T, grad_scale, loss_sums, accumulate, sync, 0,
              micro_count, c);
      if (!last_virtual(c)) {
        outputs[st.k] = slot.act->output;
        slot.act->output = Tensor();
      }
    } else if (st.kind == InterleavedStep::Kind::backward) {
      const int c = interleaved_backward_chunk(st.k, p, V), m = interleaved_microbatch(st.k, p, V);
      Tensor dy = last_virtual(c) ? Tensor() : pop(grads[static_cast<std::size_t>(c)]);
      Tensor dx = backward(m, slots[static_cast<std::size_t>(c)][static_cast<std::size_t>(m)], dy, accumulate, sync, 0,
                           micro_count, c);
      if (!first_virtual(c)) input_grads[st.k] = dx;
    } else {
      // One communication point: up to four transfers (activation to the next rank, gradient to
      // the previous one, and one of each received) posted as one grouped exchange. With p = 2
      // both directions run between the same two ranks: the tags tell them apart on mpi, the
      // canonical order of Communicator::exchange on nccl (matched by order; both neighbours
      // post the same messages in one exchange, ctest/unit/test_interleaved_schedule.cpp).
      std::vector<comm::P2POp> ops;
      std::vector<Tensor> sent;
      Tensor in, dy;
      if (st.send_output_of >= 0) {
        sent.push_back(take(outputs, st.send_output_of));
        ops.push_back(comm::P2POp::send(sent.back(), next, kForwardTag));
      }
      if (st.recv_input_chunk >= 0) {
        in = recv_activation(rows);
        ops.push_back(comm::P2POp::recv(in, prev, kForwardTag));
      }
      if (st.send_grad_of >= 0) {
        sent.push_back(take(input_grads, st.send_grad_of));
        ops.push_back(comm::P2POp::send(sent.back(), prev, kBackwardTag));
      }
      if (st.recv_grad_chunk >= 0) {
        dy = recv_activation(rows);
        ops.push_back(comm::P2POp::recv(dy, next, kBackwardTag));
      }
      comm::Work w = pp_.exchange(ops, comm::async_call());
      w.wait();   // nccl: orders the compute stream after the group; mpi: blocks until it is done
      for (auto& t : sent) keep_send(w, t);
      if (in.defined()) inputs[static_cast<std::size_t>(st.recv_input_chunk)].push_back(in);
      if (dy.defined()) grads[static_cast<std::size_t>(st.recv_grad_chunk)].push_back(dy);
    }
  }
  LMSCALE_CHECK(outputs.empty() && input_grads.empty(), "interleaved schedule: {} outputs and {} gradients never sent",
                outputs.size(), input_grads.size());
  for (auto& s : sends_) s.first.wait();
  sends_.clear();
}

void PipelineParallel::finish_timing() {
  events_.clear();
  stats_ = PipeStageStats{};
  for (const RawEvent& e : raw_) {
    PipeEvent p{e.micro, e.backward, e.weight, e.chunk, rt_.elapsed_ms(start_, e.begin), rt_.elapsed_ms(start_, e.end)};
    (p.backward ? stats_.busy_backward_ms : stats_.busy_forward_ms) += p.end_ms - p.start_ms;
    stats_.span_ms = std::max(stats_.span_ms, p.end_ms);
    events_.push_back(p);
  }
}

}  // namespace lmscale::parallel
