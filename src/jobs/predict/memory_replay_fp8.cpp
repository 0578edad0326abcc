// The allocation replay of precision.mode = fp8 (memory_replay.h): ops::Fp8Linear's operands and
// saved entries as model/transformer_fp8.cpp and ops/fp8_linear.cpp allocate them, and a dense
// block's FP8 backward. 1 byte per FP8 element; scales and amax histories fp32.
#include "memory_replay.h"

namespace lmscale::jobs::replay {

namespace {
constexpr double kScalesBytes = 16 * 4;   // Fp8LinearSaved::scales [16] fp32 (4 values, 16 bytes apart)
// model::Fp8Gemm's slots.
constexpr int qkv = 0, o = 1, w13 = 2, w2 = 3, w1 = 4, w3 = 5;
}  // namespace

double fp8_state_bytes(const Config& cfg, const Shapes& s) {
  if (!s.fp8) return 0;
  // Per operand scaling of a block: w and dy of each of its G layers (qkv, o, w13, w2; or w1, w3
  // apart), x of the 4 input owners (qkv, o, w13 or w1, w2; w3 shares w1's): scale, inverse,
  // history of H entries (current scaling: 1), and the fused kernels' [2] int32 work words.
  const double H = cfg.precision.fp8_scaling == Fp8Scaling::delayed ? static_cast<double>(cfg.precision.fp8_history) : 1;
  const double G = static_cast<double>(model::fp8_block_gemms(s.fp8_w13_grouped()).size());
  return static_cast<double>(s.L) * (G * 2 + 4) * 4 * (2 + H + 2);
}

bool Shapes::fp8_w13_grouped() const { return model::fp8_w13_grouped(index().block(0)); }

void fp8_forward(Sim& m, const Shapes& s, Block& b, int g, int count, double M, double K, double n, bool with_y) {
  const bool replay = b.f8scales[g] > 0;
  double xq = with_y ? m.alloc(M * K) : 0;   // no GEMM (a replay): only the transposes are made
  b.f8x[g] = Shared{m.alloc(M * K), count};
  for (int i = g; i < g + count; ++i) {
    // A weight gathered in e4m3 (fsdp) is the GEMM's operand itself: no cast, only its transpose.
    double wq = with_y && !s.fp8_weights ? m.alloc(n * K) : 0;
    b.f8ops[i] = m.alloc(n * K);
    if (!replay) b.f8scales[i] = m.alloc(kScalesBytes);
    m.free(wq);
  }
  m.free(xq);
}

void free_fp8_operands(Sim& m, Block& b, int g) {
  if (b.f8ops[g] <= 0) return;
  m.free(b.f8ops[g]);
  const int owner = g == w3 ? w1 : g;
  b.f8x[owner].drop(m);
}

void fp8_backward(Sim& m, Block& b, Grads& gr, int g, double M, double n, const std::vector<int>& params) {
  for (int p : params) gr.touch(p, false);
  double dq = m.alloc(M * n), dt = m.alloc(M * n);
  m.free(dq);
  m.free(dt);
  for (int p : params) gr.ready(p);
  free_fp8_operands(m, b, g);
  m.free(b.f8scales[g]);
}

void free_fp8(Sim& m, Block& b) {
  for (int g = 0; g < model::kFp8GemmSlots; ++g) {
    free_fp8_operands(m, b, g);
    m.free(b.f8scales[g]);
  }
}

void move_fp8_scales(Block& from, Block& to) {
  for (int g = 0; g < model::kFp8GemmSlots; ++g) {
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
  fp8_backward(m, b, gr, w2, s.N, s.d, {p.w2});
  double da = m.alloc(2 * NFe);   // da|db: one [N,2F] (w1|w3 one layer) or [2,N,F] tensor
  m.free(dg);
  m.free(b.a);
  m.free(b.b);
  m.free(b.y2);
  double dy2 = m.alloc(Nde);
  if (s.fp8_w13_grouped()) {
    fp8_backward(m, b, gr, w13, s.N, 2 * s.F, {p.w1, p.w3});
  } else {
    fp8_backward(m, b, gr, w1, s.N, s.F, {p.w1});
    double term = m.alloc(Nde);
    fp8_backward(m, b, gr, w3, s.N, s.F, {p.w3});
    m.free(term);
  }
  gr.touch(p.ln2);
  m.free(b.h);
  m.free(dy2);
  m.free(da);
  double dO = m.alloc(Ndle);
  fp8_backward(m, b, gr, o, s.N, s.d, {p.o});
  double dq = attention_backward(m, s, b, dO);   // frees the aux, o and dO
  m.free(b.y1);
  double dy1 = m.alloc(Nde);
  fp8_backward(m, b, gr, qkv, s.N, 3 * s.dl, {p.q, p.k, p.v});
  gr.touch(p.ln1);
  m.free(dq);
  m.free(dy1);
  free_block(m, b);
}

}  // namespace lmscale::jobs::replay
