#include "lmscale/parallel/pipeline.h"

#include <algorithm>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"

namespace lmscale::parallel {

PipeSchedule parse_pipe_schedule(const std::string& name) {
  if (name == "gpipe") return PipeSchedule::gpipe;
  if (name == "1f1b") return PipeSchedule::one_f_one_b;
  throw UsageError("parallel.schedule = " + name + ": expected gpipe or 1f1b");
}

const char* pipe_schedule_name(PipeSchedule s) { return s == PipeSchedule::gpipe ? "gpipe" : "1f1b"; }

double theory_bubble_fraction(int stages, int microbatches, int virtual_stages) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1) /
         static_cast<double>(virtual_stages);
}

struct PipelineParallel::Slot {
  std::unique_ptr<model::Activations> act;
};

PipelineParallel::PipelineParallel(model::TransformerLM& model, comm::Communicator& pp, ops::Runtime& rt,
                                   PipeSchedule schedule)
    : model_(model), pp_(pp), rt_(rt), schedule_(schedule), stage_(pp.rank()), stages_(pp.size()),
      d_(model.dims().d_model), act_dtype_(model.params().lowp_dtype()) {}

void PipelineParallel::keep_send(comm::Work w, Tensor buf) { sends_.emplace_back(std::move(w), std::move(buf)); }

Tensor PipelineParallel::recv_activation(std::int64_t rows) {
  // Activations (forward) and their gradients (backward) are both [rows, d] in the compute dtype.
  return Tensor::empty({rows, d_}, act_dtype_, *rt_.ctx().allocator, "pipeline_recv");
}

void PipelineParallel::forward(int m, Slot& slot, const Tensor& input, const Tensor& targets, std::int64_t T,
                               double grad_scale, std::vector<Tensor>& loss_sums) {
  NvtxRange r("pipeline_forward");
  const std::int64_t B = targets.dim(0);
  RawEvent e{m, false, rt_.mark(), {}};
  slot.act = model_.forward_stage(rt_.ctx(), input, targets, B, T, grad_scale);
  e.end = rt_.mark();
  raw_.push_back(std::move(e));
  if (is_last()) loss_sums.push_back(slot.act->loss_sum);
}

Tensor PipelineParallel::backward(int m, Slot& slot, Tensor dy, bool accumulate, GradientSync& sync,
                                  int micro_offset, int micro_count) {
  NvtxRange r("pipeline_backward");
  // Earlier sends are complete in the schedule's logic by now (the gradient that starts this
  // backward came after the neighbour consumed them); waiting releases their buffers.
  for (auto& s : sends_) s.first.wait();
  sends_.clear();
  RawEvent e{m, true, rt_.mark(), {}};
  Tensor dx = model_.backward_stage(rt_.ctx(), *slot.act, std::move(dy), sync.hooks(micro_offset + m, micro_count),
                                    accumulate || m > 0);
  e.end = rt_.mark();
  raw_.push_back(std::move(e));
  slot.act.reset();
  return dx;
}

void PipelineParallel::run(const std::vector<Tensor>& tokens, const std::vector<Tensor>& targets, std::int64_t T,
                           double grad_scale, bool accumulate, GradientSync& sync, int micro_offset, int micro_count,
                           std::vector<Tensor>& loss_sums) {
  NvtxRange range("pipeline");
  const int M = static_cast<int>(targets.size());
  LMSCALE_CHECK(M >= 1 && tokens.size() == targets.size(), "pipeline: {} token and {} target microbatches",
                tokens.size(), targets.size());
  const std::int64_t rows = targets[0].dim(0) * T;   // N = b*T rows of every transfer
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
    forward(f, slots[static_cast<std::size_t>(f)], in, targets[static_cast<std::size_t>(f)], T, grad_scale, loss_sums);
    if (!is_last()) {
      Tensor out = output_of(f);
      keep_send(pp_.send(out, next, 0, comm::async_call()), out);
    }
  }
  // Steady 1F1B: forward f, then backward b; transfers paired with the neighbours' (Megatron).
  Tensor in;
  if (steady > 0) in = is_first() ? tokens[static_cast<std::size_t>(f)] : recv_from(in_of(f), prev);
  for (int i = 0; i < steady; ++i, ++f, ++b) {
    forward(f, slots[static_cast<std::size_t>(f)], in, targets[static_cast<std::size_t>(f)], T, grad_scale, loss_sums);
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
  }
  // Cool-down: the remaining backwards (gpipe: all of them).
  for (; b < M; ++b) {
    Tensor dy = is_last() ? Tensor() : recv_from(recv_activation(rows), next);
    Tensor dx = backward(b, slots[static_cast<std::size_t>(b)], dy, accumulate, sync, micro_offset, micro_count);
    if (!is_first()) keep_send(pp_.send(dx, prev, 0, comm::async_call()), dx);
  }
  for (auto& s : sends_) s.first.wait();
  sends_.clear();
}

Tensor PipelineParallel::forward_only(const Tensor& tokens, const Tensor& targets, std::int64_t T) {
  const std::int64_t rows = targets.dim(0) * T;
  Tensor in = tokens;
  if (!is_first()) {
    in = recv_activation(rows);
    pp_.recv(in, stage_ - 1).wait();
  }
  auto act = model_.forward_stage(rt_.ctx(), in, targets, targets.dim(0), T, 1.0);
  if (is_last()) return act->loss_sum;
  pp_.send(act->output, stage_ + 1).wait();
  return Tensor();
}

void PipelineParallel::finish_timing() {
  events_.clear();
  stats_ = PipeStageStats{};
  for (const RawEvent& e : raw_) {
    PipeEvent p{e.micro, e.backward, rt_.elapsed_ms(start_, e.begin), rt_.elapsed_ms(start_, e.end)};
    (p.backward ? stats_.busy_backward_ms : stats_.busy_forward_ms) += p.end_ms - p.start_ms;
    stats_.span_ms = std::max(stats_.span_ms, p.end_ms);
    events_.push_back(p);
  }
}

}  // namespace lmscale::parallel
