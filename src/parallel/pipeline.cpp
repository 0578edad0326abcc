#include "lmscale/parallel/pipeline.h"

#include <algorithm>
#include <deque>

#include "lmscale/core/error.h"
#include "lmscale/core/nvtx.h"

namespace lmscale::parallel {

PipeSchedule parse_pipe_schedule(const std::string& name) {
  if (name == "gpipe") return PipeSchedule::gpipe;
  if (name == "1f1b") return PipeSchedule::one_f_one_b;
  if (name == "interleaved") return PipeSchedule::interleaved;
  throw UsageError("parallel.schedule = " + name + ": expected gpipe, 1f1b or interleaved");
}

const char* pipe_schedule_name(PipeSchedule s) {
  return s == PipeSchedule::gpipe ? "gpipe" : s == PipeSchedule::one_f_one_b ? "1f1b" : "interleaved";
}

double theory_bubble_fraction(int stages, int microbatches, int virtual_stages) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1) /
         static_cast<double>(virtual_stages);
}

namespace {
// Tags of the two directions (the mpi backend matches by tag; nccl by order).
constexpr int kForwardTag = 1, kBackwardTag = 2;
}  // namespace

struct PipelineParallel::Slot {
  std::unique_ptr<model::Activations> act;
  // The head-owning chunk: microbatch m's backward hooks, taken once at its forward (whose head
  // unit runs its backward) and used again by its backward.
  bool has_hooks = false;
  model::ParallelContext hooks;
};

PipelineParallel::PipelineParallel(std::vector<model::TransformerLM*> chunks, comm::Communicator& pp,
                                   ops::Runtime& rt, PipeSchedule schedule)
    : chunks_(std::move(chunks)), pp_(pp), rt_(rt), schedule_(schedule), stage_(pp.rank()), stages_(pp.size()),
      d_(chunks_.front()->dims().d_model), act_dtype_(chunks_.front()->params().lowp_dtype()) {
  LMSCALE_CHECK(schedule == PipeSchedule::interleaved || chunks_.size() == 1, "{} chunks for the {} schedule",
                chunks_.size(), pipe_schedule_name(schedule));
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
  if (head) {
    slot.hooks = sync.hooks(micro_offset + m, micro_count);
    slot.has_hooks = true;
  }
  RawEvent e{m, false, chunk, rt_.mark(), {}};
  // Microbatches run forward in order 0..M-1 too, so the head's gradients accumulate in the
  // order of a single process's micro-batches.
  slot.act = model.forward_stage(rt_.ctx(), input, targets, B, T, true, grad_scale,
                                 head ? slot.hooks : model::ParallelContext{}, accumulate || m > 0);
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
  Tensor dx = model.backward_stage(rt_.ctx(), *slot.act, std::move(dy),
                                   slot.has_hooks ? slot.hooks : sync.hooks(micro_offset + m, micro_count),
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
  // Virtual stage k = c * p + s (chunk c of rank s) feeds k + 1: around the ring for each chunk.
  const std::int64_t rows = targets.dim(0) * T;
  const int p = stages_, next = (stage_ + 1) % p, prev = (stage_ + p - 1) % p;
  Tensor loss;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    model::TransformerLM& model = *chunks_[c];
    Tensor in = tokens;
    if (!model.units().owns_embedding()) {
      in = recv_activation(rows);
      pp_.recv(in, prev, kForwardTag).wait();
    }
    auto act = model.forward_stage(rt_.ctx(), in, targets, targets.dim(0), T, false, 1.0);
    if (model.units().owns_head(model.dims())) loss = act->loss_sum;
    else pp_.send(act->output, next, kForwardTag).wait();
  }
  return loss;
}

void PipelineParallel::run_interleaved(const std::vector<Tensor>& tokens, const std::vector<Tensor>& targets,
                                       std::int64_t T, double grad_scale, bool accumulate, GradientSync& sync,
                                       int micro_count, std::vector<Tensor>& loss_sums) {
  // Megatron-LM's forward_backward_pipelining_with_interleaving, step by step: "k" counts the
  // rank's chunk-microbatches (M*V forwards, M*V backwards); groups of p consecutive k run the
  // same chunk on p microbatches. Received tensors queue per chunk in the order they are used.
  const int p = stages_, V = static_cast<int>(chunks_.size()), M = static_cast<int>(targets.size());
  const int total = M * V;
  LMSCALE_CHECK(M % p == 0, "interleaved: {} microbatches is not a multiple of {} stages", M, p);
  const std::int64_t rows = targets[0].dim(0) * T;
  const int next = (stage_ + 1) % p, prev = (stage_ + p - 1) % p;
  auto mod = [](int a, int n) { return ((a % n) + n) % n; };
  auto chunk_of = [&](int k, bool fwd) {
    const int c = mod(k, p * V) / p;
    return fwd ? c : V - 1 - c;
  };
  auto micro_of = [&](int k) { return (k / (p * V)) * p + k % p; };
  auto first_virtual = [&](int c) { return stage_ == 0 && c == 0; };
  auto last_virtual = [&](int c) { return stage_ == p - 1 && c == V - 1; };
  std::vector<std::deque<Tensor>> inputs(static_cast<std::size_t>(V)), grads(static_cast<std::size_t>(V));
  std::vector<std::vector<Slot>> slots(static_cast<std::size_t>(V));
  for (auto& v : slots) v.resize(static_cast<std::size_t>(M));
  auto pop = [](std::deque<Tensor>& q) {
    LMSCALE_CHECK(!q.empty(), "interleaved schedule: no tensor received for this step");
    Tensor t = q.front();
    q.pop_front();
    return t;
  };
  // Forward of chunk-microbatch k; returns the output to send (none on the last virtual stage).
  auto fwd = [&](int k) {
    const int c = chunk_of(k, true), m = micro_of(k);
    Slot& slot = slots[static_cast<std::size_t>(c)][static_cast<std::size_t>(m)];
    const Tensor in = first_virtual(c) ? tokens[static_cast<std::size_t>(m)] : pop(inputs[static_cast<std::size_t>(c)]);
    forward(m, slot, in, targets[static_cast<std::size_t>(m)], T, grad_scale, loss_sums, accumulate, sync, 0,
            micro_count, c);
    if (last_virtual(c)) return Tensor();
    Tensor out = slot.act->output;
    slot.act->output = Tensor();
    return out;
  };
  // Backward of chunk-microbatch k; returns the input gradient to send (none on virtual stage 0).
  auto bwd = [&](int k) {
    const int c = chunk_of(k, false), m = micro_of(k);
    Tensor dy = last_virtual(c) ? Tensor() : pop(grads[static_cast<std::size_t>(c)]);
    Tensor dx = backward(m, slots[static_cast<std::size_t>(c)][static_cast<std::size_t>(m)], dy, accumulate, sync, 0,
                         micro_count, c);
    return first_virtual(c) ? Tensor() : dx;
  };
  // One communication point: activations forward around the ring, gradients backward, each
  // direction with its own tag (with p = 2 both go between the same two ranks).
  auto exchange = [&](const Tensor& out, bool recv_prev, const Tensor& dx, bool recv_next) {
    Tensor in, dy;
    comm::Work wi, wd;
    if (out.defined()) keep_send(pp_.send(out, next, kForwardTag, comm::async_call()), out);
    if (recv_prev) {
      in = recv_activation(rows);
      wi = pp_.recv(in, prev, kForwardTag, comm::async_call());
    }
    if (dx.defined()) keep_send(pp_.send(dx, prev, kBackwardTag, comm::async_call()), dx);
    if (recv_next) {
      dy = recv_activation(rows);
      wd = pp_.recv(dy, next, kBackwardTag, comm::async_call());
    }
    wi.wait();
    wd.wait();
    return std::make_pair(in, dy);
  };

  const int warmup = std::min(total, (p - stage_ - 1) * 2 + (V - 1) * p);
  const bool all_warmup = warmup == total;
  const int remaining = total - warmup;
  if (!first_virtual(0)) inputs[0].push_back(exchange(Tensor(), true, Tensor(), false).first);
  for (int k = 0; k < warmup; ++k) {
    const Tensor out = fwd(k);
    const int nc = chunk_of(k + 1, true);
    bool recv_prev = !(stage_ == 0 && nc == 0) && k + 1 < total;
    const bool last_warmup = k == warmup - 1 && !all_warmup;
    const bool recv_next = last_warmup && stage_ != p - 1;
    auto [in, dy] = exchange(out, recv_prev, Tensor(), recv_next);
    if (recv_prev) inputs[static_cast<std::size_t>(nc)].push_back(in);
    if (recv_next) grads[static_cast<std::size_t>(V - 1)].push_back(dy);
  }
  for (int i = 0; i < remaining; ++i) {
    const int fk = i + warmup, bk = i;
    const Tensor out = fwd(fk);
    const Tensor dx = bwd(bk);
    bool recv_prev = true;
    int nfc;
    if (stage_ == 0) {
      nfc = chunk_of(fk - (p - 1), true);
      if (nfc == V - 1) recv_prev = false;
      nfc += 1;
    } else {
      nfc = chunk_of(fk + 1, true);
    }
    bool recv_next = true;
    int nbc;
    if (stage_ == p - 1) {
      nbc = chunk_of(bk - (p - 1), false);
      if (nbc == 0) recv_next = false;
      nbc -= 1;
    } else {
      nbc = chunk_of(bk + 1, false);
    }
    if (i == remaining - 1) recv_prev = false;
    auto [in, dy] = exchange(out, recv_prev, dx, recv_next);
    if (recv_prev) inputs[static_cast<std::size_t>(nfc)].push_back(in);
    if (recv_next) grads[static_cast<std::size_t>(nbc)].push_back(dy);
  }
  if (all_warmup && stage_ != p - 1)
    grads[static_cast<std::size_t>(V - 1)].push_back(exchange(Tensor(), false, Tensor(), true).second);
  for (int k = remaining; k < total; ++k) {
    const Tensor dx = bwd(k);
    const int nbc = chunk_of(k + 1, false);
    const bool recv_next = !(stage_ == p - 1 && nbc == V - 1) && k + 1 < total;
    auto [in, dy] = exchange(Tensor(), false, dx, recv_next);
    (void)in;
    if (recv_next) grads[static_cast<std::size_t>(nbc)].push_back(dy);
  }
  for (auto& s : sends_) s.first.wait();
  sends_.clear();
}

void PipelineParallel::finish_timing() {
  events_.clear();
  stats_ = PipeStageStats{};
  for (const RawEvent& e : raw_) {
    PipeEvent p{e.micro, e.backward, e.chunk, rt_.elapsed_ms(start_, e.begin), rt_.elapsed_ms(start_, e.end)};
    (p.backward ? stats_.busy_backward_ms : stats_.busy_forward_ms) += p.end_ms - p.start_ms;
    stats_.span_ms = std::max(stats_.span_ms, p.end_ms);
    events_.push_back(p);
  }
}

}  // namespace lmscale::parallel
