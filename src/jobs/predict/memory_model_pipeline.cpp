// Per-phase memory of one pipeline rank (parallel.pp > 1; memory_model.h): its stage's store and
// optimizer state, and a replay (memory_replay.h) of one step of parallel/pipeline.cpp on that
// rank: the schedule's forwards and backwards in the rank's order (gpipe, 1f1b, zb-h1 with its
// deferred W passes, or the interleaved plan of parallel/interleaved_schedule.h), each
// microbatch's activations kept from
// its forward to its backward, the receive buffers (an activation becomes the stage input that the
// first block keeps; a gradient becomes the running dx of the backward, then the sent input
// gradient), outputs and input gradients kept by the send list until the next backward starts (or
// the end of the step), the lazily allocated gradient buckets (or, under fsdp, the stage's units
// gathered and released per microbatch and their gradients reduce-scattered per microbatch), and
// what the trainer holds around the pipeline: every microbatch's tokens and targets, the loss sums.
#include <deque>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/model/stage.h"
#include "lmscale/parallel/interleaved_schedule.h"
#include "lmscale/parallel/spec.h"
#include "memory_replay.h"

namespace lmscale::jobs {

namespace {

using replay::Block;
using replay::Grads;
using replay::Shapes;
using replay::Shared;
using replay::Sim;

struct Chunk {
  int l0 = 0, l1 = 0;   // blocks [l0, l1)
  bool embed = false, head = false;
};

// One rank's stage (its chunks) replayed over one step (PipelineParallel::run) or one forward
// (forward_only).
class StageReplay {
 public:
  StageReplay(Sim& m, const Shapes& s, Grads& gr, std::vector<Chunk> chunks, int stages, int stage, int M,
              bool zero_bubble = false)
      : m_(m), s_(s), gr_(gr), chunks_(std::move(chunks)), p_(stages), stage_(stage), M_(M), zb_(zero_bubble),
        slots_(chunks_.size(), std::vector<Slot>(static_cast<std::size_t>(M))) {}

  // gpipe, 1f1b and zb-h1 (PipelineParallel::run): warm-up forwards, steady 1F1B, cool-down
  // backwards; zb-h1's W passes after the steady phase's backward of microbatch b >= s (W(b - s)),
  // one after each cool-down backward, the rest at the end.
  void run_1f1b(bool gpipe) {
    const bool first = stage_ == 0, last = stage_ + 1 == p_;
    const int warmup = gpipe ? M_ : std::min(p_ - stage_ - 1, M_), steady = M_ - warmup;
    int f = 0, b = 0;
    for (int i = 0; i < warmup; ++i, ++f) {   // the received input lives for the iteration
      std::shared_ptr<Shared> in = first ? nullptr : received();
      const double out = forward(0, f, in);
      if (!last) sends_.push_back(out);
      if (in) in->drop(m_);
    }
    std::shared_ptr<Shared> in;   // the steady phase's input: held until the next one is received
    if (steady > 0 && !first) in = received();
    for (int i = 0; i < steady; ++i, ++f, ++b) {
      const double out = forward(0, f, in);
      double dy = 0;
      if (!last) {   // sendrecv: this forward's output for the gradient of microbatch b's output
        dy = m_.alloc(transfer());
        sends_.push_back(out);
      }
      const double dx = backward(0, b, dy);
      if (!first) {
        if (i + 1 < steady) {   // sendrecv: dx for the next input (received before the old one is let go)
          auto next = received();
          in->drop(m_);
          in = next;
        }
        sends_.push_back(dx);
      }
      if (b >= stage_) weight_pass();
    }
    for (; b < M_; ++b) {
      const double dy = last ? 0.0 : m_.alloc(transfer());
      const double dx = backward(0, b, dy);
      if (!first) sends_.push_back(dx);
      weight_pass();
    }
    while (!weights_.empty()) weight_pass();
    release_sends();
    if (in) in->drop(m_);
  }

  // The interleaved schedule (PipelineParallel::run_interleaved): the plan's forwards, backwards
  // and exchanges; received tensors queue per chunk, produced ones wait in maps until sent.
  void run_interleaved() {
    const int V = static_cast<int>(chunks_.size());
    std::vector<std::deque<std::shared_ptr<Shared>>> inputs(static_cast<std::size_t>(V));
    std::vector<std::deque<double>> grads(static_cast<std::size_t>(V));
    std::map<int, double> outputs, input_grads;
    auto take = [](std::map<int, double>& from, int k) {
      auto it = from.find(k);
      LMSCALE_CHECK(it != from.end(), "memory replay: nothing to send for chunk-microbatch {}", k);
      const double b = it->second;
      from.erase(it);
      return b;
    };
    // The oldest tensor received for chunk c (inputs and gradients arrive in microbatch order).
    auto next = [](auto& queues, int c, const char* what) {
      auto& q = queues[static_cast<std::size_t>(c)];
      LMSCALE_CHECK(!q.empty(), "memory replay: no {} received for chunk {}", what, c);
      auto front = q.front();
      q.pop_front();
      return front;
    };
    for (const auto& st : parallel::interleaved_plan(p_, V, M_, stage_)) {
      using Kind = parallel::InterleavedStep::Kind;
      if (st.kind == Kind::forward) {
        const int c = parallel::interleaved_forward_chunk(st.k, p_, V);
        const int mb = parallel::interleaved_microbatch(st.k, p_, V);
        const Chunk& ch = chunks_[static_cast<std::size_t>(c)];
        std::shared_ptr<Shared> in = ch.embed ? nullptr : next(inputs, c, "input");
        const double out = forward(c, mb, in);
        if (!ch.head) outputs[st.k] = out;
        if (in) in->drop(m_);
      } else if (st.kind == Kind::backward) {
        const int c = parallel::interleaved_backward_chunk(st.k, p_, V);
        const int mb = parallel::interleaved_microbatch(st.k, p_, V);
        const Chunk& ch = chunks_[static_cast<std::size_t>(c)];
        const double dy = ch.head ? 0.0 : next(grads, c, "gradient");
        const double dx = backward(c, mb, dy);
        if (!ch.embed) input_grads[st.k] = dx;
      } else {   // one exchange: the sent tensors join the send list, receive buffers are new
        if (st.send_output_of >= 0) sends_.push_back(take(outputs, st.send_output_of));
        std::shared_ptr<Shared> in;
        if (st.recv_input_chunk >= 0) in = received();
        if (st.send_grad_of >= 0) sends_.push_back(take(input_grads, st.send_grad_of));
        if (st.recv_grad_chunk >= 0)
          grads[static_cast<std::size_t>(st.recv_grad_chunk)].push_back(m_.alloc(transfer()));
        if (in) inputs[static_cast<std::size_t>(st.recv_input_chunk)].push_back(in);
      }
    }
    release_sends();
  }

  // forward_only (evaluation, bench forward mode): the chunks in order, one at a time, without
  // keeping activations; the head chunk's loss sum stays.
  void run_forward_only() {
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const Chunk& ch = chunks_[c];
      double in = ch.embed ? 0.0 : m_.alloc(transfer());
      double x0 = ch.embed ? replay::embed_forward(m_, s_, gr_) : 0.0;
      std::vector<Block> blocks(static_cast<std::size_t>(s_.L));
      double out = replay::blocks_forward(m_, s_, gr_, blocks, ch.l0, ch.l1, false);
      m_.free(x0);
      if (ch.head) {
        replay::head_forward(m_, s_, gr_, false, &losses_);
      }
      m_.free(out);   // the head's input, or the output once sent
      m_.free(in);
    }
  }

 private:
  struct Slot {   // one microbatch's forward state on one chunk (its Activations)
    std::vector<Block> blocks;
    std::shared_ptr<Shared> input;   // the stage input, kept by the first block (or group)
    double dx_final = 0;             // head chunk: the gradient of the last block's output
  };

  double transfer() const { return s_.Nl * s_.d * s_.e; }   // [Nl,d] in the compute dtype
  std::shared_ptr<Shared> received() { return std::make_shared<Shared>(Shared{m_.alloc(transfer()), 1}); }

  // forward_stage with keep: returns the output (0 on the head chunk, which keeps dx_final).
  double forward(int c, int mb, std::shared_ptr<Shared> in) {
    const Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    gr_.staging_armed = mb + 1 == M_;   // the head's backward runs here with this microbatch's hooks
    gr_.micro = mb;
    Slot& slot = slots_[static_cast<std::size_t>(c)][static_cast<std::size_t>(mb)];
    slot.blocks.assign(static_cast<std::size_t>(s_.L), Block{});
    gr_.training = true;
    // The embedding's output is forward_stage's local until the blocks return.
    if (ch.embed) in = std::make_shared<Shared>(Shared{replay::embed_forward(m_, s_, gr_), 1});
    in->refs += 1;   // the activations' (block l0's input, or group l0's)
    slot.input = in;
    double out = replay::blocks_forward(m_, s_, gr_, slot.blocks, ch.l0, ch.l1, true);
    if (ch.embed) in->drop(m_);
    if (!ch.head) return out;
    slot.dx_final = replay::head_forward(m_, s_, gr_, true, &losses_);
    m_.free(out);
    return 0;
  }

  // backward_stage after the send list is waited on and released; dy: the received gradient
  // (0 on the head chunk). Returns the input gradient (dy's buffer), 0 on the embedding chunk.
  double backward(int c, int mb, double dy) {
    release_sends();
    gr_.staging_armed = mb + 1 == M_;   // PipelineParallel::hooks_for: the last microbatch's arm the reduction
    gr_.micro = mb;                     // fsdp: which micro-batch the backward hooks reduce
    const Chunk& ch = chunks_[static_cast<std::size_t>(c)];
    Slot& slot = slots_[static_cast<std::size_t>(c)][static_cast<std::size_t>(mb)];
    double dx = ch.head ? slot.dx_final : dy;
    slot.dx_final = 0;
    replay::DeferredWeights work;   // zb-h1: the B pass's deferred products (TransformerLM::weight_work)
    replay::blocks_backward(m_, s_, gr_, slot.blocks, ch.l0, ch.l1, zb_ ? &work : nullptr);
    slot.input->drop(m_);
    slot.input.reset();
    if (zb_) weights_.push_back({mb, std::move(work)});
    if (!ch.embed) return dx;
    replay::embed_backward(m_, s_, gr_);
    m_.free(dx);
    return 0;
  }

  // zb-h1 (PipelineParallel::weight_pass): the W pass of the oldest microbatch whose B ran, with
  // that microbatch's hooks (the last one's arm the reduction's bf16 copies).
  void weight_pass() {
    if (weights_.empty()) return;
    auto [mb, work] = std::move(weights_.front());
    weights_.pop_front();
    gr_.staging_armed = mb + 1 == M_;
    gr_.micro = mb;
    replay::backward_weights(m_, gr_, work);
  }

  void release_sends() {
    for (double& b : sends_) m_.free(b);
    sends_.clear();
  }

  Sim& m_;
  const Shapes& s_;
  Grads& gr_;
  std::vector<Chunk> chunks_;
  int p_, stage_, M_;
  bool zb_ = false;   // zb-h1: backwards split into B and a deferred W
  std::deque<std::pair<int, replay::DeferredWeights>> weights_;   // (microbatch, its products), oldest first
  std::vector<std::vector<Slot>> slots_;
  std::vector<double> sends_;   // sent buffers, kept until the next backward (PipelineParallel::sends_)
  double losses_ = 0;           // the head chunk's loss sums (kept until the step's losses are reduced)
};

}  // namespace

MemoryPhases predict_pipeline_phases(const Config& cfg, int world, bool cuda, int rank) {
  MemoryPhases out;
  const auto dims = model::ModelDims::from(cfg.model);
  const bool bench = cfg.run.job == JobKind::bench_model;
  const BenchMode mode = job_mode(cfg);
  const auto& pc = cfg.parallel;
  const parallel::Spec spec = parallel::Spec::resolve(pc, world);
  const comm::MeshShape mesh = spec.mesh_shape();
  const int tp = mesh.tp, pp = mesh.pp, dp = mesh.dp;
  const comm::MeshCoords at = comm::mesh_coords(mesh, rank);
  const int stage = at.pp, dp_rank = at.dp;
  const int M = static_cast<int>(std::max<std::int64_t>(1, pc.microbatches));
  const bool interleaved = pc.schedule == PipelineSchedule::interleaved;
  const int V = interleaved ? static_cast<int>(pc.virtual_stages) : 1;
  LMSCALE_CHECK(!(spec.fsdp() && interleaved),
                "memory model: fsdp with the interleaved schedule is not predicted (the deck refuses it)");
  const std::int64_t global = bench ? cfg.bench.batch_size : cfg.train.batch_size;
  const double local = static_cast<double>(global / dp);   // rows of this dp rank (grad_accum is 1 with pp)
  const double workspace = cuda ? 32.0 * 1024 * 1024 : 0.0;   // cuBLASLt's, allocated with the runtime

  // The rank's chunks and its store: their parameters in order (one store; the flat layout
  // follows the units, so each chunk is a contiguous range of the whole model's parameters).
  const Shapes micro = replay::shapes_for(cfg, static_cast<double>(static_cast<std::int64_t>(local) / M), cuda);
  const auto all_sizes = replay::param_sizes(micro);
  const auto all_joins = replay::param_joins(micro);
  std::vector<Chunk> chunks;
  std::vector<double> sizes;
  std::vector<bool> joins;
  std::vector<int> local_index(all_sizes.size(), -1);
  for (const auto& u : model::pipeline_chunks(dims, pp, V, stage, pc.stage_layers)) {
    chunks.push_back({u.first_layer(), u.end_layer(dims), u.owns_embedding(), u.owns_head(dims)});
    for (int i = u.first_param(dims); i < u.end_param(dims); ++i) {
      local_index[static_cast<std::size_t>(i)] = static_cast<int>(sizes.size());
      sizes.push_back(all_sizes[static_cast<std::size_t>(i)]);
      joins.push_back(all_joins[static_cast<std::size_t>(i)]);
    }
  }
  double P = 0;
  for (double n : sizes) P += n;
  const bool last_stage = stage + 1 == pp;
  // Gradients: lazy buckets with one data-parallel rank (256 MiB) and under zero2 (bucket_mb),
  // else DDP's / zero1's flat buffer (in the init bytes); under fsdp the stage's units sharded
  // over its dp group (memory_replay_fsdp.cpp: gathered weights and full-size unit gradients
  // replayed, shards in the init bytes).
  const bool lazy = spec.grad_storage() == parallel::GradStorage::lazy_buckets;
  Grads gr;
  double init = 0;
  if (spec.fsdp()) {
    init = replay::setup_fsdp(gr, cfg, micro, dp, local_index);
  } else {
    init = replay::store_bytes(cfg, spec, micro, P, dp_rank, cuda);
    gr.lazy = lazy;
    gr.local = local_index;
    gr.init(sizes, joins, spec.lazy_bucket_bytes());
    // bf16 gradient reduction: the copies of the stage's buckets (made during the last
    // microbatch's backward), or ddp flat's one copy, made in finish() inside the optimizer phase.
    replay::set_reduce_staging(gr, spec, sizes, P, dp_rank);
  }
  const double flat_staging = gr.finish_stage;
  const double base = init + workspace;
  // zb-h1: 1f1b's order with each backward's weight-gradient products deferred to its W pass
  // (up to s + 1 microbatches' products alive on stage s; memory_replay_deferred.cpp).
  const bool zb = pc.schedule == PipelineSchedule::zb_h1;
  out.layout = fmt::format("pipeline stage {} of {} ({}{}, {} microbatches{}{}), {}", stage, pp,
                           to_string(pc.schedule),
                           interleaved ? fmt::format(" with {} chunks", V) : std::string(), M,
                           tp > 1 ? fmt::format(", tp {}{}", tp, micro.sp ? " sp" : "") : std::string(),
                           dp > 1 ? fmt::format(", dp {}", dp) : std::string(),
                           spec.fsdp() ? "fsdp over dp (shards of the stage's units; gathered units replayed)"
                           : dp == 1    ? "gradients in 256 MiB buckets"
                           : lazy     ? "zero2 gradient buckets of bucket_mb"
                           : spec.sharded_optimizer() ? spec.data_parallel_name() + " flat gradients"
                                                      : "ddp flat gradients");
  out.phases = {{"init", base}};
  if (mode == BenchMode::forward) {
    // Trainer::forward_loss: the whole local batch through the chunks in order.
    const Shapes whole = replay::shapes_for(cfg, local, cuda);
    Sim m;
    m.cuda = cuda;
    m.alloc(base);
    Grads g = gr;
    g.sim = &m;
    m.alloc(2 * 4 * whole.B * whole.T);   // inputs and targets
    StageReplay(m, whole, g, chunks, pp, stage, 1).run_forward_only();
    if (!last_stage) m.alloc(4);   // the 0 loss sum the other stages report
    out.phases.push_back({"forward", m.peak});
  } else {
    Sim m;
    m.cuda = cuda;
    m.alloc(base);
    Grads g = gr;
    g.sim = &m;
    // PipelineSchedule::forward_backward: every microbatch's inputs and targets uploaded first.
    m.alloc(M * 2 * 4 * micro.B * micro.T);
    StageReplay r(m, micro, g, chunks, pp, stage, M, zb);
    if (interleaved) r.run_interleaved();
    else r.run_1f1b(pc.schedule == PipelineSchedule::gpipe);
    if (!last_stage) m.alloc(4.0 * M);   // the 0 loss sums the other stages report
    // forward-backward mode: finish() runs after the phase mark, so ddp flat's copy shows in
    // the next step's phase, over what is alive at the mark.
    out.phases.push_back({"forward_backward", mode == BenchMode::forward_backward ? std::max(m.peak, m.cur + flat_staging) : m.peak});
    // The optimizer phase's peak is at its start: the gradients, the microbatches' inputs,
    // targets and loss sums are alive at the phase mark (the step allocates nothing larger).
    if (mode == BenchMode::train_step) out.phases.push_back({"optimizer", m.cur + flat_staging});
  }
  for (const auto& p : out.phases) out.peak = std::max(out.peak, p.bytes);
  return out;
}

}  // namespace lmscale::jobs
