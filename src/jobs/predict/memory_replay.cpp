// The allocation replay (memory_replay.h): transformer.cpp's tensors in order, with their sizes.
#include "memory_replay.h"

#include <cmath>

#include "lmscale/model/model_dims.h"
#include "lmscale/model/param_layout.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/parallel/state_layout.h"
#include "lmscale/parallel/zero.h"

namespace lmscale::jobs::replay {

Shapes shapes_for(const Config& cfg, double rows, bool cuda) {
  const auto dims = model::ModelDims::from(cfg.model);
  const int tp = static_cast<int>(std::max<std::int64_t>(1, cfg.parallel.tp));
  const bool mixed = computes_16bit(cfg.precision.mode, cuda);
  Shapes s;
  s.B = rows;
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
  s.fp8 = cfg.precision.mode == PrecisionMode::fp8;
  s.fp8_weights = s.fp8 && cfg.parallel.zero == ZeroLevel::fsdp && cfg.parallel.fsdp_gather_dtype == FsdpGatherDtype::fp8;
  s.fp8_swiglu_fused = s.fp8 && model::fp8_swiglu_casts_fused(model::fp8_options(cfg.precision));
  // The one-kernel form on CUDA (the model's rows are aligned); elsewhere the op composes the plain
  // producer and the cast through a temporary.
  s.fp8_swiglu_kernel = s.fp8_swiglu_fused && cuda &&
                        ops::fp8_cast_kernel_shape(static_cast<std::int64_t>(s.N), static_cast<std::int64_t>(s.F));
  s.tp = tp;
  s.chunk = static_cast<double>(dims.head_chunk_rows(static_cast<std::int64_t>(s.N), dims.vocab / tp, mixed ? 2 : 4));
  s.flash = dims.flash;
  s.deterministic = dims.deterministic_attention;
  s.cuda = cuda;
  s.L = static_cast<int>(dims.layers);
  s.k = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(cfg.train.checkpoint_k, dims.layers)));
  s.recompute = model::RecomputePolicy::from(cfg.train);
  if (dims.moe()) {
    s.moe_every = static_cast<int>(dims.moe_every);
    s.ep = static_cast<int>(std::max<std::int64_t>(1, cfg.parallel.ep));
    s.E = static_cast<double>(dims.moe_experts);
    s.El = s.E / s.ep;
    s.topk = static_cast<double>(dims.moe_top_k);
    s.Fe = static_cast<double>(dims.moe_dff);
    s.M = s.N * s.topk;
    if (dims.moe_capacity_factor > 0)
      s.M = std::min(s.M, s.B * s.E * static_cast<double>(dims.expert_capacity(dims.context)));
    s.Me = s.M;
  }
  return s;
}

model::ParamIndex Shapes::index() const {
  model::ModelDims dims;
  dims.layers = L;
  dims.moe_every = moe_every;
  dims.moe_experts = moe_every > 0 ? static_cast<std::int64_t>(E) : 0;
  return model::ParamIndex(dims);
}

std::vector<double> param_sizes(const Shapes& s) {
  std::vector<double> p{s.V * s.d};
  for (int l = 0; l < s.L; ++l) {
    if (s.is_moe(l)) {   // q, k, v, o, ln1, router, this rank's experts' w1, w3, w2, ln2 (model::ParamIndex)
      const double ex = s.El * s.Fe * s.d;
      for (double n : {s.d * s.d, s.d * s.d, s.d * s.d, s.d * s.d, s.d, s.E * s.d, ex, ex, ex, s.d}) p.push_back(n);
      continue;
    }
    // q, k, v, o, ln1, w1, w3, w2, ln2
    for (double n : {s.dl * s.d, s.dl * s.d, s.dl * s.d, s.d * s.dl, s.d, s.F * s.d, s.F * s.d, s.d * s.F, s.d}) p.push_back(n);
  }
  p.push_back(s.d);
  p.push_back(s.V * s.d);
  return p;
}

std::vector<bool> param_joins(const Shapes& s) {
  const model::ParamIndex index = s.index();
  std::vector<bool> j(static_cast<std::size_t>(index.count()));
  for (int i = 0; i < index.count(); ++i) j[static_cast<std::size_t>(i)] = index.joins_next(i);
  return j;
}

void ffn_inputs(Sim& m, const Shapes& s, Block& b) {
  double g = s.sp ? m.alloc(s.N * s.d * s.e) : 0.0;
  b.a = m.alloc(2 * s.N * s.F * s.e);
  if (s.fp8) fp8_forward(m, s, b, model::Fp8Gemm::w13, s.N, s.d, 2 * s.F);   // one FP8 layer over [2F, d]
  m.free(g);
}

double block_forward(Sim& m, const Shapes& s, Block& b, bool need_output, int l) {
  const double Nde = s.N * s.d * s.e, Nlde = s.Nl * s.d * s.e, Ndle = s.N * s.dl * s.e, NFe = s.N * s.F * s.e;
  b.rstd1 = m.alloc(s.st * s.Nl);
  b.y1 = m.alloc(Nlde);
  b.q = m.alloc(3 * Ndle);   // q|k|v: views of one [N,3dl] tensor (b.k, b.v stay 0)
  if (s.fp8)   // q|k|v: one FP8 layer over [3dl, d]
    fp8_forward(m, s, b, model::Fp8Gemm::qkv, s.N, s.d, 3 * s.dl);
  if (s.sp) {   // tp_f all-gathers y1 into a [N,d] temporary for the three matmuls
    double g = m.alloc(Nde);
    m.free(g);
  }
  if (b.o <= 0) {   // a recompute under keep_attention finds o and the aux kept from the forward
    b.o = m.alloc(Ndle);
    b.aux = m.alloc(s.flash ? s.st * s.B * s.H * s.T : s.B * s.H * s.T * s.T * s.e);
  }
  double proj = m.alloc(Nde);
  if (s.fp8) fp8_forward(m, s, b, model::Fp8Gemm::o, s.N, s.dl, s.d);
  if (s.sp) {   // tp_g reduce-scatters into a new [Nl,d] tensor
    double shard = m.alloc(Nlde);
    m.free(proj);
    proj = shard;
  }
  b.h = m.alloc(Nlde);
  b.rstd2 = m.alloc(s.st * s.Nl);
  b.y2 = m.alloc(Nlde);
  m.free(proj);   // after the fused h = x + proj, y2 = rmsnorm2(h)
  if (s.is_moe(l)) {   // the experts behind the router; h + out written into out
    double out = moe_forward(m, s, b);
    if (!need_output) m.free(out);
    return out;
  }
  ffn_inputs(m, s, b);
  // TransformerLM::fp8_swiglu_fused: a first forward casts g inside SwiGLU (never stored).
  const bool g_fp8_only = s.fp8_swiglu_fused && b.f8scales[static_cast<std::size_t>(model::Fp8Gemm::w2)] <= 0;
  if (!g_fp8_only) b.g = m.alloc(NFe);
  if (!need_output) {
    if (s.fp8) fp8_forward(m, s, b, model::Fp8Gemm::w2, s.N, s.F, s.d, false);   // w2's operands only
    if (s.fp8) m.free(b.g);   // the FP8 backward reads the saved g^T
    return 0;
  }
  double out = m.alloc(Nde);
  if (s.fp8) fp8_forward(m, s, b, model::Fp8Gemm::w2, s.N, s.F, s.d, true, g_fp8_only && !s.fp8_swiglu_kernel ? NFe : 0);
  if (s.fp8) m.free(b.g);
  if (s.sp) {
    double shard = m.alloc(Nlde);
    m.free(out);
    out = shard;
  }
  return out;
}

void free_block(Sim& m, Block& b) {
  for (double* t : {&b.x, &b.rstd1, &b.y1, &b.q, &b.k, &b.v, &b.o, &b.aux, &b.h, &b.rstd2, &b.y2, &b.a, &b.b, &b.g,
                    &b.probs, &b.lse, &b.experts, &b.gates, &b.slot, &b.xe, &b.ye, &b.perm})
    m.free(*t);
  free_fp8(m, b);
}

void recompute_norm(Sim& m, const Shapes& s, double& y) {
  if (y > 0) return;
  y = m.alloc(s.Nl * s.d * s.e);
  double r = m.alloc(s.st * s.Nl);
  m.free(r);
}

double attention_backward(Sim& m, const Shapes& s, Block& b, double& dO) {
  const double Ndle = s.N * s.dl * s.e;
  double dq = m.alloc(3 * Ndle);   // one [3,N,dl] tensor: dq, dk, dv
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
  return dq;
}

void block_backward(Sim& m, const Shapes& s, Block& b, Grads& gr, int l, DeferredWeights* defer) {
  if (defer) return block_backward_deferred(m, s, b, gr, l, *defer);
  if (s.fp8 && !s.is_moe(l)) return block_backward_fp8(m, s, b, gr, l);
  const double Nde = s.N * s.d * s.e, Nlde = s.Nl * s.d * s.e, Ndle = s.N * s.dl * s.e, NFe = s.N * s.F * s.e;
  const model::BlockParams p = s.index().block(l);
  if (s.is_moe(l)) {
    moe_backward(m, s, b, gr, l);
  } else {
  if (b.a <= 0) {             // selective-mlp: y2, a, b again
    recompute_norm(m, s, b.y2);
    ffn_inputs(m, s, b);
  }
  if (b.g <= 0) b.g = m.alloc(NFe);
  double dg = m.alloc(NFe);
  gr.touch(p.w2, false);
  if (s.sp) {   // tp_g_backward gathers dx into a [N,d] temporary for the w2 GEMMs
    double dout = m.alloc(Nde);
    m.free(dout);
  }
  gr.ready(p.w2);
  m.free(b.g);
  double da = m.alloc(2 * NFe), db = 0;   // one [2,N,F] tensor
  m.free(dg);
  m.free(b.a);
  m.free(b.b);
  recompute_norm(m, s, b.y2);
  double dy2 = m.alloc(Nde);   // dy2 = da w1 + db w3, accumulated in the GEMM epilogue
  gr.touch(p.w1, false);
  gr.touch(p.w3, false);
  if (s.tp > 1) {
    // Tensor parallel (transformer.cpp): the input gradients first, then f's backward started
    // (sequence parallel: a new [Nl,d] result; the gathered y2 and the old [N,d] dy2 live until
    // the weight gradients are done), w1 and w3 notified after their GEMMs.
    double y2full = s.sp ? m.alloc(Nde) : 0.0;
    const double res = s.sp ? m.alloc(Nlde) : 0.0;
    gr.ready(p.w1);
    gr.ready(p.w3);
    if (s.sp) {
      m.free(dy2);
      m.free(y2full);
      dy2 = res;
    }
  } else {
    gr.ready(p.w1);
    gr.ready(p.w3);
  }
  gr.touch(p.ln2);   // the norm's input gradient is added to dx: no [Nl,d] temporary
  m.free(b.y2);
  m.free(b.h);
  for (double* t : {&dy2, &da, &db}) m.free(*t);
  }
  double dO = m.alloc(Ndle);
  gr.touch(p.o, false);
  if (s.sp) {   // tp_g_backward: dx gathered for the output projection's GEMMs
    double dproj = m.alloc(Nde);
    m.free(dproj);
  }
  gr.ready(p.o);
  double dq = attention_backward(m, s, b, dO), dk = 0, dv = 0;   // one [3,N,dl] tensor
  recompute_norm(m, s, b.y1);
  double dy1 = m.alloc(Nde);   // dq wq + dk wk + dv wv, accumulated in the GEMM epilogues
  for (int i : {p.q, p.k, p.v}) gr.touch(i, false);
  if (s.tp > 1) {   // as in the FFN: y1 gathered, f's backward started, then the weight gradients
    double y1full = s.sp ? m.alloc(Nde) : 0.0;
    const double res = s.sp ? m.alloc(Nlde) : 0.0;
    for (int i : {p.q, p.k, p.v}) gr.ready(i);
    if (s.sp) {
      m.free(dy1);
      m.free(y1full);
      dy1 = res;
    }
  } else {
    for (int i : {p.q, p.k, p.v}) gr.ready(i);
  }
  gr.touch(p.ln1);   // as in the FFN: added to dx
  for (double* t : {&dq, &dk, &dv, &dy1}) m.free(*t);
  free_block(m, b);
}

double embed_forward(Sim& m, const Shapes& s, Grads& gr) {
  gr.before_forward(0);
  double x = m.alloc(s.N * s.d * s.e);
  if (s.sp) {   // vocabulary-parallel: each rank's part [N,d], reduce-scattered into its rows
    double shard = m.alloc(s.Nl * s.d * s.e);
    m.free(x);
    x = shard;
  }
  gr.after_forward(0);
  return x;
}

double blocks_forward(Sim& m, const Shapes& s, Grads& gr, std::vector<Block>& blocks, int l0, int l1, bool keep) {
  double x = 0;   // the current block's input; block l0's is the caller's
  if (s.moe_every > 0) m.alloc(s.st);   // act.moe_loss [1]: the router losses, alive with the activations
  for (int l = l0; l < l1; ++l) {
    // What the block keeps: the same per-block answer the model applies (run_blocks_forward).
    const model::BlockKeep k = keep ? s.recompute.block(l, l0, l1, s.flash) : model::BlockKeep{};
    const bool checkpointed = k.recomputed, group_start = k.group_input;
    Block b;
    gr.before_forward(l + 1);
    double out = block_forward(m, s, b, true, l);
    if (s.is_moe(l)) {   // the router losses' terms [3] (run_blocks_forward), freed with the iteration
      double terms = m.alloc(3 * s.st);
      m.free(terms);
    }
    if (keep && !checkpointed) {
      b.x = x;   // the block's input stays with its activations
      if (k.drop_norms) {
        m.free(b.y1);
        m.free(b.y2);
        m.free(b.g);
      }
      if (k.drop_probabilities) m.free(b.aux);
      if (k.drop_ffn_inputs) {
        m.free(b.a);
        m.free(b.b);
        free_fp8_operands(m, b, model::Fp8Gemm::w13);   // fp8: w1|w3's operands (the scales stay for the replay)
      }
      blocks[static_cast<std::size_t>(l)] = b;
    } else {
      if (k.attention) {   // o and the aux stay for the backward (recompute.h)
        blocks[static_cast<std::size_t>(l)].o = b.o;
        blocks[static_cast<std::size_t>(l)].aux = b.aux;
        b.o = b.aux = 0;
      }
      if (checkpointed) move_fp8_scales(b, blocks[static_cast<std::size_t>(l)]);   // for the recompute's replay
      free_block(m, b);
      // The input dies with the block unless the caller or a group input holds it.
      if (l > l0 && !group_start) m.free(x);
      else if (l > l0) blocks[static_cast<std::size_t>(l)].x = x;   // freed by that group's backward
    }
    gr.after_forward(l + 1);
    x = out;
  }
  return x;
}

void blocks_backward(Sim& m, const Shapes& s, Grads& gr, std::vector<Block>& blocks, int l0, int l1,
                     DeferredWeights* defer) {
  if (l1 <= l0) return;
  const bool every_k = s.recompute.mode == model::RecomputePolicy::Mode::every_k;
  const int lc = every_k ? s.recompute.checkpointed_end(l0, l1) : l1;
  for (int l = l1 - 1; l >= lc; --l) {   // blocks past the checkpointed ones: as without checkpointing
    gr.before_backward(l + 1);
    block_backward(m, s, blocks[static_cast<std::size_t>(l)], gr, l, defer);
    gr.after_backward(l + 1);
  }
  if (lc <= l0) return;
  const int k = every_k ? s.k : 1;
  for (int g = (lc - 1) / k; g >= l0 / k; --g) {   // groups [g k, (g+1) k) within [l0, lc), last first
    const int lo = std::max(l0, g * k), hi = std::min(lc, g * k + k);
    for (int l = hi - 1; l >= lo; --l) gr.before_backward(l + 1);
    if (every_k) {   // recompute the group, keeping its activations; its last block's output is not needed
      const double in = blocks[static_cast<std::size_t>(lo)].x;
      for (int l = lo; l < hi; ++l) {
        Block b;
        b.o = blocks[static_cast<std::size_t>(l)].o;   // kept under keep_attention, else 0
        b.aux = blocks[static_cast<std::size_t>(l)].aux;
        for (int f = 0; f < model::kFp8GemmsPerBlock; ++f) b.f8scales[f] = blocks[static_cast<std::size_t>(l)].f8scales[f];
        const double out = block_forward(m, s, b, l + 1 < hi, l);
        b.x = l == lo ? in : blocks[static_cast<std::size_t>(l)].x;
        blocks[static_cast<std::size_t>(l)] = b;
        if (l + 1 < hi) blocks[static_cast<std::size_t>(l + 1)].x = out;
      }
    }
    for (int l = hi - 1; l >= lo; --l) {
      block_backward(m, s, blocks[static_cast<std::size_t>(l)], gr, l, defer);
      gr.after_backward(l + 1);
    }
  }
}

double head_forward(Sim& m, const Shapes& s, Grads& gr, bool keep, double* loss) {
  // transformer_head.cpp: final norm, then the LM head + cross-entropy in row chunks of one
  // reused logits buffer; a training forward runs the unit's backward here too.
  const double Nde = s.N * s.d * s.e, Nlde = s.Nl * s.d * s.e;
  gr.before_forward(s.L + 1);
  *loss += m.alloc(s.st);   // kept until the step's losses are reduced
  double rstd = m.alloc(s.st * s.Nl), y = m.alloc(Nlde), yfull = s.sp ? m.alloc(Nde) : 0.0;
  double dy = 0;
  if (keep) {
    gr.before_backward(s.L + 1);
    dy = m.alloc(Nde);
    gr.touch(s.index().lm_head(), false);   // lm_head: written by the chunks below
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
  if (keep) gr.ready(s.index().lm_head());   // the model's notify: after the chunks, before y is dropped
  if (!keep) {
    for (double* t : {&rstd, &y, &yfull}) m.free(*t);
    gr.after_forward(s.L + 1);
    return 0;
  }
  m.free(yfull);
  m.free(y);
  double dx = m.alloc(Nlde);   // d(loss)/d(last block output): where the blocks' backward starts
  gr.touch(s.index().ln_final());       // ln_final
  gr.after_backward(s.L + 1);
  m.free(rstd);
  m.free(dy);
  gr.after_forward(s.L + 1);
  return dx;
}

void embed_backward(Sim& m, const Shapes& s, Grads& gr) {
  gr.before_backward(0);
  gr.touch(0);   // embedding
  if (s.sp) {    // tp_g backward: dx gathered to [N,d] for the vocabulary-parallel table gradient
    double full = m.alloc(s.N * s.d * s.e);
    m.free(full);
  }
  gr.after_backward(0);
}

double replay(const Shapes& s, Sim& m, Grads& gr, bool keep, bool backward) {
  const double base = m.cur;
  double batch = m.alloc(4 * s.B * s.T);   // inputs and targets, int32 (the host copy or the device one)
  double targets = m.alloc(4 * s.B * s.T);
  std::vector<Block> blocks(static_cast<std::size_t>(s.L));
  gr.training = keep;
  // The embedding output, held by forward() until the blocks return (and by block 0 or group 0
  // for the backward).
  double x0 = embed_forward(m, s, gr);
  double x = blocks_forward(m, s, gr, blocks, 0, s.L, keep);
  if (!keep) m.free(x0);
  double loss = 0;
  double dx = head_forward(m, s, gr, keep, &loss);
  m.free(x);   // the last block's output
  if (!keep) {
    m.free(batch);
    m.free(targets);
    return m.peak - base;
  }
  if (backward) {
    blocks_backward(m, s, gr, blocks, 0, s.L);
    m.free(x0);   // with block 0's activations
    embed_backward(m, s, gr);
  }
  m.free(dx);
  return m.peak - base;
}

double store_bytes(const Config& cfg, const parallel::Spec& spec, const Shapes& s, double P, int dp_rank, bool cuda) {
  const int dp = spec.gradient_group();   // the ranks ZeRO shards over (dp / ep)
  const bool lazy = spec.grad_storage() == parallel::GradStorage::lazy_buckets;
  const bool mixed = computes_16bit(cfg.precision.mode, cuda);
  const bool offload = spec.offload != OffloadMode::none;
  // fp32 state tensors per parameter: 2 for adamw and lamb (m, v), 1 for sgd and lars.
  // parallel.offload = optimizer (parallel/offloaded_shards.h): on a GPU run the owned range's
  // fp32 master, m and v live in host memory, and the device keeps the working copy and gradients
  // as without offload; of the fp32 master, with a working copy, only the norm weights (the store
  // packs the ranges the forward reads in fp32: Spec::master_in_store), else all of it (it is the
  // weights the forward reads).
  const double states = cuda && offload ? 0.0
                        : cfg.optim.name == OptimizerName::sgd || cfg.optim.name == OptimizerName::lars ? 1.0 : 2.0;
  double master = P;
  if (mixed && !spec.master_in_store()) {
    const auto sizes = param_sizes(s);
    const model::ParamIndex index = s.index();
    master = 0;
    for (int i = 0; i < index.count(); ++i)
      if (index.is_norm(i)) master += sizes[static_cast<std::size_t>(i)];
  }
  double bytes = 4 * master + (mixed ? 2 * P : 0.0);
  if (offload && !cuda) {
    // On CPU ranks the host is the device: the host master of the owned range [a, b) and the two
    // staging slots (fp32 gradients and fp32 parameters: CPU runs are fp32) of the largest chunk,
    // a unit's part of the range of at most 32 Mi elements.
    const auto counts = parallel::even_split(static_cast<std::int64_t>(P), spec.sharded_optimizer() ? dp : 1);
    double a = 0;
    for (int r = 0; r < (spec.sharded_optimizer() ? dp_rank : 0); ++r) a += static_cast<double>(counts[static_cast<std::size_t>(r)]);
    const double b = a + static_cast<double>(counts[static_cast<std::size_t>(spec.sharded_optimizer() ? dp_rank : 0)]);
    const auto sizes = param_sizes(s);
    const model::ParamIndex index = s.index();   // MoE blocks hold a router too
    std::vector<double> unit(static_cast<std::size_t>(s.L + 2), 0.0);
    double at = 0;
    for (int i = 0; i < index.count(); ++i) {
      const double n = sizes[static_cast<std::size_t>(i)];
      unit[static_cast<std::size_t>(index.unit_of(i))] += std::max(0.0, std::min(b, at + n) - std::max(a, at));
      at += n;
    }
    double slot = 0;
    for (const double n : unit) slot = std::max(slot, std::min(n, 33554432.0));
    bytes += 4 * (b - a) + 2 * slot * (4 + 4);
  }
  if (!lazy) bytes += 4 * P;   // one flat fp32 gradient buffer
  if (spec.sharded_optimizer()) {
    const auto counts = parallel::even_split(static_cast<std::int64_t>(P), dp);
    const double shard = static_cast<double>(counts[static_cast<std::size_t>(dp_rank)]);
    bytes += states * 4 * shard + (spec.gradient_shard() ? 4 * shard : 0.0);
    // (zero2's copy-engine window: memory_model.cpp, which knows the buckets its flags count.)
  } else {
    bytes += states * 4 * P;
  }
  return bytes;
}

void set_reduce_staging(Grads& gr, const parallel::Spec& spec, const std::vector<double>& sizes, double P, int dp_rank) {
  using parallel::ReduceStaging;
  const int dp = spec.gradient_group();
  gr.group_of.clear();
  gr.group_pending.clear();
  gr.group_stage.clear();
  gr.counted.clear();
  gr.finish_stage = 0;
  const ReduceStaging kind = spec.reduce_staging();
  if (kind == ReduceStaging::none) return;
  if (kind == ReduceStaging::flat) {
    gr.finish_stage = 2 * P;
    return;
  }
  const std::size_t n = sizes.size();
  gr.counted.assign(n, false);
  if (kind == ReduceStaging::per_param) {
    gr.group_of.resize(n);
    for (std::size_t i = 0; i < n; ++i) gr.group_of[i] = static_cast<int>(i);
    gr.group_pending.assign(n, 1);
    for (double numel : sizes) gr.group_stage.push_back(2 * numel);
    return;
  }
  gr.group_of = gr.bucket_of;
  gr.group_pending.assign(gr.bucket_bytes.size(), 0);
  for (int b : gr.bucket_of) ++gr.group_pending[static_cast<std::size_t>(b)];
  // ZeRO-2's buckets cover elements [offset, offset + numel) of the flat order, taken from the
  // end; this rank receives their overlap with its shard (zero.cpp: even_split, i.e. slice_of).
  const auto [lo, hi] = parallel::slice_of(static_cast<std::int64_t>(P), dp_rank, dp);
  double end = P;
  for (double bytes : gr.bucket_bytes) {
    const double numel = bytes / 4, offset = end - numel;
    const double mine = std::max(0.0, std::min(static_cast<double>(hi), end) - std::max(static_cast<double>(lo), offset));
    gr.group_stage.push_back(2 * numel + (spec.bucket_reduce_scatter() ? 2 * std::max(mine, 1.0) : 0.0));
    end = offset;
  }
}


}  // namespace lmscale::jobs::replay
