// Per-phase memory prediction (include/lmscale/jobs/memory_model.h). The activations and gradient
// buckets are not summed from formulas but replayed: a small simulator allocates and frees the
// bytes of every tensor in the order src/model/transformer.cpp does, so the peak lands where the
// real one does (e.g. while the first gradient bucket is allocated at the start of the backward,
// or while the FFN gradients of the last block are alive). Keep it in step with transformer.cpp:
// the CPU test (ctest/regression/memory_prediction.sh) fails when they drift apart by over 5%.
#include "lmscale/jobs/memory_model.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "lmscale/jobs/accounting.h"
#include "lmscale/core/memory_tracker.h"
#include "lmscale/model/model_dims.h"

namespace lmscale::jobs {

namespace {

// Current and peak bytes of one rank's allocator, as its MemoryTracker counts them: the bytes
// asked for. (The CUDA caching allocator rounds blocks to 512 B / 2 MiB and may hand out a cached
// block up to 1.25x larger, but its tracker records the requested size, and /memory/peaks is what
// the prediction is compared with; `round` stays the identity.)
struct Sim {
  bool cuda = false;
  double cur = 0, peak = 0;
  double round(double b) const { return b; }
  double alloc(double b) {
    b = round(b);
    cur += b;
    peak = std::max(peak, cur);
    return b;
  }
  void free(double& b) {
    cur -= b;
    b = 0;
  }
};

// What block_forward keeps (bytes, already rounded; 0 = not held).
struct Block {
  double x = 0, rstd1 = 0, y1 = 0, q = 0, k = 0, v = 0, o = 0, aux = 0, h = 0, rstd2 = 0, y2 = 0, a = 0, b = 0, g = 0;
};

struct Shapes {
  double N = 0, Nl = 0, d = 0, dl = 0, F = 0, H = 0, T = 0, B = 0, V = 0, e = 4, st = 4;
  bool flash = false, sp = false, cuda = false, deterministic = false;
  int L = 0, tp = 1;
  double chunk = 1;   // rows per chunk of the fused LM head + cross-entropy
  std::string ac = "none";
  int k = 1;
};

// Parameter sizes (elements) in the store's order: embedding, per layer q,k,v,o,ln1,w1,w2,w3,ln2
// (transformer.cpp's Slot order), ln_final, lm_head; local shapes under tensor parallelism.
std::vector<double> param_sizes(const Shapes& s) {
  std::vector<double> p{s.V * s.d};
  for (int l = 0; l < s.L; ++l)
    for (double n : {s.dl * s.d, s.dl * s.d, s.dl * s.d, s.d * s.dl, s.d, s.F * s.d, s.d * s.F, s.F * s.d, s.d}) p.push_back(n);
  p.push_back(s.d);
  p.push_back(s.V * s.d);
  return p;
}

// The gradient provider: LazyGradients allocates a parameter's bucket (model/gradient_buckets.cpp:
// reverse parameter order, at most bucket_bytes each) the first time the backward asks for one
// of its gradients; with a flat buffer (or FSDP) nothing is allocated here.
struct Grads {
  Sim* sim = nullptr;
  bool lazy = false;
  std::vector<int> bucket_of;
  std::vector<double> bucket_bytes;
  std::vector<bool> held;
  void init(const std::vector<double>& sizes, double max_bytes) {
    const double cap = std::floor(max_bytes / 4);
    double fill = 0;
    bucket_of.assign(sizes.size(), -1);
    for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
      const double n = sizes[static_cast<std::size_t>(i)];
      if (bucket_bytes.empty() || fill + n > cap) {
        bucket_bytes.push_back(0);
        fill = 0;
      }
      fill += n;
      bucket_bytes.back() += 4 * n;
      bucket_of[static_cast<std::size_t>(i)] = static_cast<int>(bucket_bytes.size()) - 1;
    }
    held.assign(bucket_bytes.size(), false);
  }
  // FSDP (parallel/fsdp.cpp): units 0 = embedding, 1..L = blocks, L+1 = head; each unit's
  // weights gathered (compute dtype, padded to dp shards) ahead of use and released after it, its
  // full-size fp32 gradients allocated at the first gradient and freed once reduce-scattered
  // (kReductionsInFlight = 1 reduction left in flight).
  bool fsdp = false, training = false, reshard = true;
  int prefetch = 1, last = 0, dp = 1;
  double e = 4;
  std::vector<double> unit_padded;           // elements of each unit, padded to dp shards
  std::vector<int> unit_of_param;            // -1 for the replicated norms
  std::vector<double> gathered, full, send;  // bytes alive per unit (send: the cast shard, mixed precision)
  std::vector<double> pending;               // reductions in flight (full-size gradients)
  void gather(int u) {
    const auto i = static_cast<std::size_t>(u);
    if (i >= gathered.size() || gathered[i] > 0) return;
    if (e < 4) send[i] = sim->alloc(e * unit_padded[i] / dp);
    gathered[i] = sim->alloc(e * unit_padded[i]);
  }
  void wait(int u) { sim->free(send[static_cast<std::size_t>(u)]); }
  void release(int u) {
    sim->free(gathered[static_cast<std::size_t>(u)]);
    sim->free(send[static_cast<std::size_t>(u)]);
  }
  void before_forward(int u) {
    if (!fsdp) return;
    for (int j = u; j <= std::min(u + prefetch, last); ++j) gather(j);
    wait(u);
  }
  void after_forward(int u) {
    if (fsdp && !(training && (!reshard || u == last))) release(u);
  }
  void before_backward(int u) {
    if (!fsdp) return;
    if (u > 0) gather(u);
    for (int j = u - 1; j >= std::max(1, u - prefetch); --j) gather(j);
    if (u > 0) wait(u);
  }
  void after_backward(int u) {
    if (!fsdp) return;
    release(u);
    if (full[static_cast<std::size_t>(u)] > 0) {
      pending.push_back(full[static_cast<std::size_t>(u)]);
      full[static_cast<std::size_t>(u)] = 0;
    }
    while (pending.size() > 1) {
      sim->free(pending.front());
      pending.erase(pending.begin());
    }
  }
  void touch(int i) {
    if (fsdp) {
      const int u = unit_of_param[static_cast<std::size_t>(i)];
      if (u >= 0 && full[static_cast<std::size_t>(u)] <= 0)
        full[static_cast<std::size_t>(u)] = sim->alloc(4 * unit_padded[static_cast<std::size_t>(u)]);
      return;
    }
    if (!lazy) return;
    const auto b = static_cast<std::size_t>(bucket_of[static_cast<std::size_t>(i)]);
    if (held[b]) return;
    held[b] = true;
    sim->alloc(bucket_bytes[b]);
  }
  double total() const {
    double t = 0;
    for (double b : bucket_bytes) t += b;
    return t;
  }
};

// block_forward: allocations in transformer.cpp's order; returns the output's bytes (0 when a
// recompute's last block does not produce one).
double block_forward(Sim& m, const Shapes& s, Block& b, bool need_output) {
  const double Nde = s.N * s.d * s.e, Nlde = s.Nl * s.d * s.e, Ndle = s.N * s.dl * s.e, NFe = s.N * s.F * s.e;
  b.rstd1 = m.alloc(s.st * s.Nl);
  b.y1 = m.alloc(Nlde);
  b.q = m.alloc(Ndle);
  b.k = m.alloc(Ndle);
  b.v = m.alloc(Ndle);
  if (s.sp) {   // tp_f all-gathers y1 into a [N,d] temporary for the three matmuls
    double g = m.alloc(Nde);
    m.free(g);
  }
  b.o = m.alloc(Ndle);
  b.aux = m.alloc(s.flash ? s.st * s.B * s.H * s.T : s.B * s.H * s.T * s.T * s.e);
  double proj = m.alloc(Nde);
  if (s.sp) {   // tp_g reduce-scatters into a new [Nl,d] tensor
    double shard = m.alloc(Nlde);
    m.free(proj);
    proj = shard;
  }
  b.h = m.alloc(Nlde);
  m.free(proj);
  b.rstd2 = m.alloc(s.st * s.Nl);
  b.y2 = m.alloc(Nlde);
  b.a = m.alloc(NFe);
  b.b = m.alloc(NFe);
  if (s.sp) {
    double g = m.alloc(Nde);
    m.free(g);
  }
  b.g = m.alloc(NFe);
  if (!need_output) return 0;
  double out = m.alloc(Nde);
  if (s.sp) {
    double shard = m.alloc(Nlde);
    m.free(out);
    out = shard;
  }
  return out;
}

void free_block(Sim& m, Block& b) {
  for (double* t : {&b.x, &b.rstd1, &b.y1, &b.q, &b.k, &b.v, &b.o, &b.aux, &b.h, &b.rstd2, &b.y2, &b.a, &b.b, &b.g})
    m.free(*t);
}

// A recomputed rmsnorm output (recompute_norm): y kept, the rstd twin dropped at once.
void recompute_norm(Sim& m, const Shapes& s, double& y) {
  if (y > 0) return;
  y = m.alloc(s.Nl * s.d * s.e);
  double r = m.alloc(s.st * s.Nl);
  m.free(r);
}

void block_backward(Sim& m, const Shapes& s, Block& b, Grads& gr, int l) {
  const double Nde = s.N * s.d * s.e, Nlde = s.Nl * s.d * s.e, Ndle = s.N * s.dl * s.e, NFe = s.N * s.F * s.e;
  const int p0 = 1 + l * 9;   // slots q,k,v,o,ln1,w1,w2,w3,ln2
  if (b.a <= 0) {             // selective-mlp: y2, a, b again
    recompute_norm(m, s, b.y2);
    b.a = m.alloc(NFe);
    b.b = m.alloc(NFe);
  }
  if (b.g <= 0) b.g = m.alloc(NFe);
  double dg = m.alloc(NFe);
  gr.touch(p0 + 6);
  m.free(b.g);
  double da = m.alloc(NFe), db = m.alloc(NFe);
  m.free(dg);
  m.free(b.a);
  m.free(b.b);
  recompute_norm(m, s, b.y2);
  double dy2 = m.alloc(Nde), dy2b = m.alloc(Nde);
  gr.touch(p0 + 5);
  gr.touch(p0 + 7);
  m.free(dy2b);
  double dh = m.alloc(Nlde);
  gr.touch(p0 + 8);
  m.free(b.y2);
  m.free(b.h);
  for (double* t : {&dy2, &dh, &da, &db}) m.free(*t);
  double dO = m.alloc(Ndle);
  gr.touch(p0 + 3);
  double dq = m.alloc(Ndle), dk = m.alloc(Ndle), dv = m.alloc(Ndle);
  if (s.flash && s.cuda && s.deterministic) {   // the atomic-free backward: D = rowsum(dO*O) only
    double D = m.alloc(s.st * s.B * s.H * s.T);
    m.free(D);
  } else if (s.flash && s.cuda && s.e == 2 && (s.dl / s.H == 64 || s.dl / s.H == 128)) {
    // The Hopper kernels (ops/cuda/flash_attention.cpp), every GPU lent here: D and lse * log2(e)
    // over rows padded to whole 64-query tiles, and the blocked fp32 dQ accumulator over them.
    // (Other GPUs take the FA2 path below: a little less.)
    const double Tp = std::ceil(s.T / 64) * 64;
    double D = m.alloc(4 * s.B * s.H * Tp), L2 = m.alloc(4 * s.B * s.H * Tp), acc = m.alloc(4 * s.B * Tp * s.dl);
    m.free(D);
    m.free(L2);
    m.free(acc);
  } else if (s.flash && s.cuda) {   // FA2 backward workspaces: D = rowsum(dO*O) and the fp32 dQ accumulator
    double D = m.alloc(s.st * s.B * s.H * s.T), acc = m.alloc(4 * s.N * s.dl);
    m.free(D);
    m.free(acc);
  } else if (!s.flash && b.aux <= 0) {   // selective: the probabilities again (and a discarded output)
    b.aux = m.alloc(s.B * s.H * s.T * s.T * s.e);
    double o = m.alloc(Ndle);
    m.free(o);
  }
  m.free(b.aux);
  m.free(b.o);
  m.free(dO);
  recompute_norm(m, s, b.y1);
  double dy1 = m.alloc(Nde), tmp = m.alloc(Nde);
  gr.touch(p0);
  gr.touch(p0 + 1);
  gr.touch(p0 + 2);
  double dxn = s.Nl == s.N ? 0 : m.alloc(Nlde);
  gr.touch(p0 + 4);
  for (double* t : {&dq, &dk, &dv, &dy1, &tmp, &dxn}) m.free(*t);
  free_block(m, b);
}

// One micro-batch's forward (keep = for a backward) and, if `backward`, its backward: the peak
// above what was held before.
double replay(const Shapes& s, Sim& m, Grads& gr, bool keep, bool backward) {
  const double base = m.cur;
  const double Nde = s.N * s.d * s.e, Nlde = s.Nl * s.d * s.e;
  double batch = m.alloc(4 * s.B * s.T);   // inputs and targets, int32 (the host copy or the device one)
  double targets = m.alloc(4 * s.B * s.T);
  const bool every_k = keep && s.ac == "every-k", selective = keep && (s.ac == "selective" || s.ac == "selective-mlp");
  std::vector<Block> blocks(static_cast<std::size_t>(s.L));
  std::vector<bool> group_input(static_cast<std::size_t>(s.L), false);   // block l's input kept as a group input
  gr.training = keep;
  gr.before_forward(0);
  double x0 = m.alloc(s.sp ? Nlde : Nde);   // the embedding output, held by forward() until the blocks return
  gr.after_forward(0);
  double x = x0;
  for (int l = 0; l < s.L; ++l) {
    if (every_k && l % s.k == 0) group_input[static_cast<std::size_t>(l)] = true;
    Block b;
    gr.before_forward(l + 1);
    double out = block_forward(m, s, b, true);
    if (keep && !every_k) {
      b.x = x;   // the block's input stays with its activations
      if (selective) {
        m.free(b.y1);
        m.free(b.y2);
        m.free(b.g);
        if (!s.flash) m.free(b.aux);
        if (s.ac == "selective-mlp") {
          m.free(b.a);
          m.free(b.b);
        }
      }
      blocks[static_cast<std::size_t>(l)] = b;
    } else {
      free_block(m, b);
      // The input dies with the block unless the forward's local (x0) or a group input holds it.
      if (l > 0 && !group_input[static_cast<std::size_t>(l)]) m.free(x);
      else if (l > 0) blocks[static_cast<std::size_t>(l)].x = x;   // freed by that group's backward
    }
    gr.after_forward(l + 1);
    x = out;
  }
  if (!keep || every_k) {
    if (every_k) blocks[0].x = x0;   // group 0's input
    else m.free(x0);
  }
  // Head unit (transformer_head.cpp): final norm, then the LM head + cross-entropy in row chunks
  // of one reused logits buffer; a training forward runs the unit's backward here too.
  gr.before_forward(s.L + 1);
  double loss_sum = m.alloc(s.st);   // kept until the step's losses are reduced
  (void)loss_sum;
  double rstd = m.alloc(s.st * s.Nl), y = m.alloc(Nlde), yfull = s.sp ? m.alloc(Nde) : 0.0;
  double dy = 0;
  if (keep) {
    gr.before_backward(s.L + 1);
    dy = m.alloc(Nde);
    gr.touch(2 + 9 * s.L);   // lm_head
  }
  // The chunks: the logits buffer, a loss scalar per chunk after the first, per chunk the CUDA
  // cross-entropy's row losses (fp32) or, vocabulary-parallel, the row max and (sum, target) pair.
  const double rows = s.chunk, chunks = std::ceil(s.N / s.chunk);
  double logits = m.alloc(rows * s.V * s.e);
  double part = chunks > 1 ? m.alloc(s.st) : 0.0;
  for (double c = 0; c < std::min(chunks, 2.0); ++c) {   // every chunk allocates the same (the last no more)
    const double n = std::min(rows, s.N - c * rows);
    if (s.tp > 1) {
      double row_max = m.alloc(s.st * n), sums = m.alloc(2 * s.st * n);
      if (s.cuda) {
        double r = m.alloc(4 * n);
        m.free(r);
      }
      m.free(row_max);
      m.free(sums);
    } else if (s.cuda) {
      double r = m.alloc(4 * n);
      m.free(r);
    }
  }
  if (keep && s.sp) {   // the f backward reduce-scatters dy into a new [Nl,d] (dy kept until it is done)
    double shard = m.alloc(Nlde);
    m.free(logits);
    m.free(part);
    m.free(dy);
    dy = shard;
  }
  m.free(logits);
  m.free(part);
  if (!keep) {
    for (double* t : {&rstd, &y, &yfull, &x, &batch, &targets}) m.free(*t);
    gr.after_forward(s.L + 1);
    return m.peak - base;
  }
  m.free(yfull);
  m.free(y);
  double dx = m.alloc(Nlde);   // d(loss)/d(last block output): where the blocks' backward starts
  gr.touch(1 + 9 * s.L);       // ln_final
  gr.after_backward(s.L + 1);
  m.free(rstd);
  m.free(dy);
  m.free(x);                   // the last block's output
  gr.after_forward(s.L + 1);
  if (backward) {
    const int L = s.L;
    const int k = every_k ? s.k : 1;
    for (int g = (L - 1) / k; g >= 0; --g) {
      const int lo = g * k, hi = std::min(L, lo + k);
      for (int l = hi - 1; l >= lo; --l) gr.before_backward(l + 1);
      if (every_k) {   // recompute the group, keeping its activations; its last block's output is not needed
        double in = blocks[static_cast<std::size_t>(lo)].x;
        for (int l = lo; l < hi; ++l) {
          Block b;
          const double out = block_forward(m, s, b, l + 1 < hi);
          b.x = l == lo ? in : blocks[static_cast<std::size_t>(l)].x;
          blocks[static_cast<std::size_t>(l)] = b;
          if (l + 1 < hi) blocks[static_cast<std::size_t>(l + 1)].x = out;
        }
      }
      for (int l = hi - 1; l >= lo; --l) {
        block_backward(m, s, blocks[static_cast<std::size_t>(l)], gr, l);
        gr.after_backward(l + 1);
      }
    }
    gr.before_backward(0);
    gr.touch(0);   // embedding
    gr.after_backward(0);
  }
  m.free(dx);
  return m.peak - base;
}

}  // namespace

std::string job_mode(const Config& cfg) { return cfg.run.job == "bench-model" ? cfg.bench.mode : "train-step"; }

MemoryPhases predict_memory_phases(const Config& cfg, int world, bool cuda) {
  MemoryPhases out;
  const auto dims = model::ModelDims::from(cfg.model);
  const bool bench = cfg.run.job == "bench-model";
  const std::string mode = job_mode(cfg);
  const int tp = static_cast<int>(std::max<std::int64_t>(1, cfg.parallel.tp));
  const int pp = static_cast<int>(std::max<std::int64_t>(1, cfg.parallel.pp));
  const int dp = cfg.parallel.dp > 0 ? static_cast<int>(cfg.parallel.dp) : std::max(1, world / (tp * pp));
  const std::string& zero = cfg.parallel.zero;
  const bool fsdp = dp > 1 && zero == "fsdp", sharded = dp > 1 && zero != "none";
  const bool mixed = cfg.precision.mode != "fp32";
  const std::int64_t accum = bench ? 1 : std::max<std::int64_t>(1, cfg.train.grad_accum);
  const std::int64_t global = bench ? cfg.bench.batch_size : cfg.train.batch_size;
  const double workspace = cuda ? 32.0 * 1024 * 1024 : 0.0;   // cuBLASLt's, allocated with the runtime

  Shapes s;
  s.B = static_cast<double>(global / dp / accum);
  s.T = static_cast<double>(dims.context);
  s.N = s.B * s.T;
  s.sp = tp > 1 && cfg.parallel.sequence_parallel;
  s.Nl = s.sp ? s.N / tp : s.N;
  s.d = static_cast<double>(dims.d_model);
  s.dl = s.d / tp;
  s.F = static_cast<double>(dims.d_ff) / tp;
  s.H = static_cast<double>(dims.heads) / tp;
  s.V = static_cast<double>(dims.vocab) / tp;
  s.e = mixed ? 2 : 4;
  s.tp = tp;
  s.chunk = static_cast<double>(dims.head_chunk_rows(static_cast<std::int64_t>(s.N), dims.vocab / tp, mixed ? 2 : 4));
  s.flash = dims.flash;
  s.deterministic = dims.deterministic_attention;
  s.cuda = cuda;
  s.L = static_cast<int>(dims.layers);
  s.ac = cfg.train.activation_checkpointing;
  s.k = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(cfg.train.checkpoint_k, dims.layers)));
  const auto sizes = param_sizes(s);
  double P = 0, norms = 0;
  for (double n : sizes) P += n;
  norms = (2.0 * s.L + 1) * s.d;

  Sim probe;
  probe.cuda = cuda;
  // Long-lived state after init, per layout.
  double init = 0, grads_after = 0;   // grads_after: gradient bytes alive when the backward ends
  // fp32 state tensors per parameter: 2 for adamw and lamb (m, v), 1 for sgd and lars.
  const double states = cfg.optim.name == "sgd" || cfg.optim.name == "lars" ? 1.0 : 2.0;
  Grads gr;
  gr.sim = nullptr;
  if (pp > 1) {
    // Pipeline stages: the stage accounting (accounting_pipeline.cpp) with its microbatches in flight.
    const Accounting a = account_pipeline(cfg, world, "");
    double act = 0, param = 0;
    for (const auto& it : a.memory) (it.name == "activations" ? act : init) += it.bytes;
    for (const auto& it : a.memory)
      if (it.name == "parameters") param = it.bytes / 4;
    const bool lazy = dp == 1 || zero == "zero2";
    grads_after = lazy ? 4 * param : 0;
    out.layout = "pipeline stage (coarse: the stage accounting with microbatches in flight)";
    const double fb = init + workspace + act + grads_after;
    out.phases = {{"init", init + workspace}};
    if (mode == "forward") out.phases.push_back({"forward", init + workspace + act});
    else out.phases.push_back({"forward_backward", fb});
    if (mode == "train-step") out.phases.push_back({"optimizer", init + workspace + grads_after});
  } else {
    if (fsdp) {
      gr.fsdp = true;
      gr.e = s.e;
      gr.dp = dp;
      gr.prefetch = static_cast<int>(cfg.parallel.fsdp_prefetch);
      gr.reshard = cfg.parallel.reshard_after_forward;
      gr.last = s.L + 1;
      auto padded = [&](double n) { return std::ceil(n / dp) * dp; };
      gr.unit_padded.push_back(padded(s.V * s.d));
      for (int l = 0; l < s.L; ++l) gr.unit_padded.push_back(padded(4 * s.d * s.dl + 3 * s.d * s.F));
      gr.unit_padded.push_back(padded(s.V * s.d));
      gr.unit_of_param.push_back(0);
      for (int l = 0; l < s.L; ++l)
        for (int slot = 0; slot < 9; ++slot) gr.unit_of_param.push_back(slot == 4 || slot == 8 ? -1 : l + 1);
      gr.unit_of_param.push_back(-1);
      gr.unit_of_param.push_back(s.L + 1);
      gr.gathered.assign(gr.unit_padded.size(), 0);
      gr.full.assign(gr.unit_padded.size(), 0);
      gr.send.assign(gr.unit_padded.size(), 0);
      const double Ps = P - norms, S = std::ceil(Ps / dp);
      init = probe.round(4 * S) * 2 + probe.round(4 * norms) * 2 + probe.round(4 * S) * states + probe.round(4 * norms) * states;
      // Under tensor parallelism (2D) the sizes above are this tp rank's slices (local shapes), so
      // the units, shards and gathers are those of the slices.
      out.layout = std::string("fsdp (master, gradient shard and optimizer state of 1/dp") +
                   (tp > 1 ? " of this tp rank's slices" : "") + "; gathered units beside the replayed activations)";
    } else {
      init = probe.round(4 * P) + (mixed ? probe.round(2 * P) : 0.0);
      const bool lazy = dp == 1 || zero == "zero2";
      if (!lazy) init += probe.round(4 * P);   // one flat fp32 gradient buffer
      // Optimizer state (AdamW, LAMB m and v; SGD, LARS the momentum buffer) and gradient shard.
      if (sharded) init += (states == 2 ? probe.round(8 * P / dp) : probe.round(4 * P / dp)) + probe.round(4 * P / dp);
      else init += states * probe.round(4 * P);
      gr.lazy = lazy;
      gr.init(sizes, dp == 1 ? 256.0 * 1024 * 1024 : cfg.parallel.bucket_mb * 1024.0 * 1024.0);
      out.layout = dp == 1 ? (tp > 1 ? "tensor parallel (local shapes), gradients in 256 MiB buckets" : "one process, gradients in 256 MiB buckets")
                           : zero == "zero2" ? "zero2 (gradient buckets of bucket_mb, shard of the optimizer state)"
                           : sharded        ? zero + " (flat gradients, gradient shard and 1/dp of the optimizer state)"
                                            : "ddp (flat gradient buffer)";
    }
    auto run = [&](bool keep, bool backward, bool grads_held) {
      Sim m;
      m.cuda = cuda;
      Grads g = gr;
      g.sim = &m;
      if (grads_held) {
        for (std::size_t b = 0; b < g.held.size(); ++b)
          if (g.lazy) {
            g.held[b] = true;
            m.alloc(g.bucket_bytes[b]);
          }
      }
      replay(s, m, g, keep, backward);
      return m.peak;
    };
    // Gradients alive when the backward ends: every bucket (one process, zero2: released after
    // the step / the reduce-scatters), or under FSDP the embedding's full-size gradients, whose
    // reduce-scatter is the one left in flight.
    grads_after = gr.lazy ? gr.total() : fsdp ? probe.round(4 * gr.unit_padded[0]) : 0.0;
    const double base = init + workspace;
    out.phases = {{"init", init + workspace}};
    if (mode == "forward") {
      out.phases.push_back({"forward", base + run(false, false, false)});
    } else {
      out.phases.push_back({"forward_backward", base + run(true, true, false)});
      if (mode == "train-step") {
        // The optimizer phase starts with every gradient bucket alive (released after the step);
        // with grad_accum > 1 it also holds micro-batches 2.. (their forward and backward run
        // after the first one's phase mark, with the buckets already allocated).
        // Its peak is at its start: the phase mark comes while the last micro-batch's inputs,
        // targets and loss sum are still alive (they die with its scope).
        double opt = init + workspace + grads_after + 2 * probe.round(4 * s.B * s.T) +
                     probe.round(s.st) * static_cast<double>(accum);
        if (accum > 1) opt = std::max(opt, base + run(true, true, true));
        out.phases.push_back({"optimizer", opt});
      }
    }
  }
  for (const auto& p : out.phases) out.peak = std::max(out.peak, p.bytes);
  return out;
}

double write_memory_prediction(JobEnv& env) {
  const MemoryPhases pred = predict_memory_phases(env.cfg, env.world, env.rt.device() == Device::cuda);
  const auto& measured = env.rt.allocator().tracker().phase_peaks();
  auto table = env.out.create_table("/bench_model/memory_prediction", {{"phase", io::Column::Type::str, ""},
                                                                       {"predicted_bytes", io::Column::Type::f64, "bytes"},
                                                                       {"measured_bytes", io::Column::Type::f64, "bytes"},
                                                                       {"error", io::Column::Type::f64, ""}});
  for (const auto& p : pred.phases) {
    const auto it = measured.find(p.phase);
    const double got = it == measured.end() ? 0.0 : static_cast<double>(it->second);
    // error = predicted / measured - 1 (negative: the prediction is short).
    table.append({p.phase, p.bytes, got, got > 0 ? p.bytes / got - 1 : 0.0});
  }
  env.out.set_attr("/bench_model", "memory_model_layout", pred.layout);
  return pred.peak;
}

}  // namespace lmscale::jobs
