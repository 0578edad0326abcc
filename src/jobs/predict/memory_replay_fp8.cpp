// The allocation replay of precision.mode = fp8 (memory_replay.h): ops::Fp8Linear's operands and
// saved entries as model/transformer_fp8.cpp and ops/fp8_linear.cpp allocate them, and a dense
// block's FP8 backward. 1 byte per FP8 element; scales and amax histories fp32.
#include "memory_replay.h"

namespace lmscale::jobs::replay {

namespace {
constexpr double kScalesBytes = 16 * 4;   // Fp8LinearSaved::scales [16] fp32 (4 values, 16 bytes apart)
std::size_t at(model::Fp8Gemm g) { return static_cast<std::size_t>(g); }
}  // namespace

double fp8_state_bytes(const Config& cfg, const Shapes& s) {
  if (!s.fp8) return 0;
  // Per operand scaling (x, w and dy of each of a block's 4 layers qkv, o, w13, w2): scale,
  // inverse, history of H entries (current scaling: 1), the fused kernels' [2] int32 work words
  // and, on CUDA, the [1] int32 record slot.
  const double H = cfg.precision.fp8_scaling == Fp8Scaling::delayed ? static_cast<double>(cfg.precision.fp8_history) : 1;
  const double scaling = static_cast<double>(s.L) * (3.0 * model::kFp8GemmsPerBlock) * 4 * (2 + H + 2 + (s.cuda ? 1 : 0));
  // The step's casts: each layer's weight codes and their transpose (1 byte per element each) and
  // its pending amax (model::Fp8WeightCasts; one fp32 per layer, one allocation).
  const double weights = 3 * s.dl * s.d + s.d * s.dl + 2 * s.F * s.d + s.d * s.F;
  const double codes = s.fp8_step_casts ? static_cast<double>(s.L) * (2 * weights + 4.0 * model::kFp8GemmsPerBlock) : 0;
  return scaling + codes;
}

void fp8_forward(Sim& m, const Shapes& s, Block& b, model::Fp8Gemm g, double M, double K, double n, bool with_y,
                 double producer_temp) {
  const bool replay = b.f8scales[at(g)] > 0;
  double xq = with_y ? m.alloc(M * K) : 0;   // no GEMM (a replay): only the transposes are made
  b.f8x[at(g)] = m.alloc(M * K);
  double temp = m.alloc(producer_temp);
  m.free(temp);
  // A weight gathered in e4m3 (fsdp) is the GEMM's operand itself: no cast, only its transpose;
  // one the step cast (fp8_step_casts) comes with its transpose, kept from step to step.
  double wq = with_y && !s.fp8_weights && !s.fp8_step_casts ? m.alloc(n * K) : 0;
  b.f8ops[at(g)] = s.fp8_step_casts ? 0 : m.alloc(n * K);
  if (!replay) b.f8scales[at(g)] = m.alloc(kScalesBytes);
  m.free(wq);
  m.free(xq);
}

void free_fp8_operands(Sim& m, Block& b, model::Fp8Gemm g) {
  if (b.f8ops[at(g)] <= 0 && b.f8x[at(g)] <= 0) return;
  m.free(b.f8ops[at(g)]);
  m.free(b.f8x[at(g)]);
}

void fp8_backward(Sim& m, Block& b, Grads& gr, model::Fp8Gemm g, double M, double n, const std::vector<int>& params,
                  double* dy_q, double* dy_qt) {
  for (int p : params) gr.touch(p, false);
  double dq = dy_q ? *dy_q : m.alloc(M * n), dt = dy_qt ? *dy_qt : m.alloc(M * n);
  m.free(dq);
  m.free(dt);
  if (dy_q) *dy_q = 0;
  if (dy_qt) *dy_qt = 0;
  for (int p : params) gr.ready(p);
  free_fp8_operands(m, b, g);
  m.free(b.f8scales[at(g)]);
}

void free_fp8(Sim& m, Block& b) {
  for (model::Fp8Gemm g : model::kFp8BlockGemms) {
    free_fp8_operands(m, b, g);
    m.free(b.f8scales[at(g)]);
  }
}

void move_fp8_scales(Block& from, Block& to) {
  for (int g = 0; g < model::kFp8GemmsPerBlock; ++g) {
    to.f8scales[g] = from.f8scales[g];
    from.f8scales[g] = 0;
  }
}

void block_backward_fp8(Sim& m, const Shapes& s, Block& b, Grads& gr, int l) {
  const double Nde = s.N * s.d * s.e, Ndle = s.N * s.dl * s.e, NFe = s.N * s.F * s.e;
  const model::BlockParams p = s.index().block(l);
  if (b.a <= 0) {   // selective-mlp: y2, then a and b replayed
    recompute_norm(m, s, b.y2);
    ffn_inputs(m, s, b);
  }
  m.free(b.g);
  double dg = m.alloc(NFe);
  fp8_backward(m, b, gr, model::Fp8Gemm::w2, s.N, s.d, {p.w2});
  // da|db [N,2F], the w1|w3 layer's dy: in the compute dtype, or (fused) only its FP8 codes and
  // their transpose (the CPU op makes the plain da|db for a moment, then casts).
  double da = 0, dab_q = 0, dab_qt = 0;
  if (s.fp8_swiglu_fused) {
    dab_q = m.alloc(2 * s.N * s.F);
    dab_qt = m.alloc(2 * s.N * s.F);
    double plain = s.fp8_swiglu_kernel ? 0 : m.alloc(2 * NFe);
    m.free(plain);
  } else {
    da = m.alloc(2 * NFe);
  }
  m.free(dg);
  m.free(b.a);
  m.free(b.b);
  m.free(b.y2);
  double dy2 = m.alloc(Nde);
  fp8_backward(m, b, gr, model::Fp8Gemm::w13, s.N, 2 * s.F, {p.w1, p.w3}, s.fp8_swiglu_fused ? &dab_q : nullptr,
               s.fp8_swiglu_fused ? &dab_qt : nullptr);
  gr.touch(p.ln2);
  m.free(b.h);
  m.free(dy2);
  m.free(da);
  double dO = m.alloc(Ndle);
  fp8_backward(m, b, gr, model::Fp8Gemm::o, s.N, s.d, {p.o});
  double dq = attention_backward(m, s, b, dO);   // frees the aux, o and dO
  m.free(b.y1);
  double dy1 = m.alloc(Nde);
  fp8_backward(m, b, gr, model::Fp8Gemm::qkv, s.N, 3 * s.dl, {p.q, p.k, p.v});
  gr.touch(p.ln1);
  m.free(dq);
  m.free(dy1);
  free_block(m, b);
}

}  // namespace lmscale::jobs::replay
