// The MoE block's allocations in the replay (memory_replay.h): transformer_moe.cpp's forward and
// backward of the experts behind the router, in its order, with Shapes' M (kept assignments of
// this rank's tokens) and Me (rows its experts compute). Under expert parallelism the all-to-alls
// themselves allocate nothing (the mpi backend moves host buffers); the received rows, the
// permutation and the rows sent back are tensors.
#include "memory_replay.h"

namespace lmscale::jobs::replay {

double moe_forward(Sim& m, const Shapes& s, Block& b) {
  const double e = s.e, st = s.st, d = s.d, N = s.N, k = s.topk;
  const bool ep = s.ep > 1;
  double logits = m.alloc(N * s.E * e);
  b.probs = m.alloc(N * s.E * st);
  b.lse = m.alloc(N * st);
  b.experts = m.alloc(N * k * 4);
  b.gates = m.alloc(N * k * st);
  m.free(logits);
  b.slot = m.alloc(N * k * 4);
  double kept = m.alloc(s.E * 4), routed = m.alloc(s.E * 4);   // the plan's counts, until the return
  double xt = m.alloc(s.M * d * e);                            // this rank's tokens' rows, expert order
  if (!ep) {
    b.xe = xt;
    xt = 0;
  } else {
    double xr = m.alloc(s.Me * d * e);   // received from the ep group
    m.free(xt);
    b.perm = m.alloc(s.Me * 4);
    b.xe = m.alloc(s.Me * d * e);
    m.free(xr);
  }
  b.a = m.alloc(2 * s.Me * s.Fe * e);   // a, b: one [2,Me,Fe] tensor
  b.g = m.alloc(s.Me * s.Fe * e);
  double ye = m.alloc(s.Me * d * e);
  if (!ep) {
    b.ye = ye;
    ye = 0;
  } else {
    double yr = m.alloc(s.Me * d * e);   // back in the received order
    m.free(ye);
    b.ye = m.alloc(s.M * d * e);
    m.free(yr);
  }
  const double out = m.alloc(N * d * e);
  m.free(kept);
  m.free(routed);
  return out;
}

void moe_backward(Sim& m, const Shapes& s, Block& b, Grads& gr, int l) {
  const double e = s.e, st = s.st, d = s.d, N = s.N, k = s.topk;
  const bool ep = s.ep > 1;
  const model::BlockParams p = s.index().block(l);
  double dyt = m.alloc(s.M * d * e), dgates = m.alloc(N * k * st);
  m.free(b.ye);
  double dye = 0;
  if (!ep) {
    dye = dyt;
    dyt = 0;
  } else {
    double dyr = m.alloc(s.Me * d * e);
    dye = m.alloc(s.Me * d * e);
    m.free(dyr);
    m.free(dyt);
  }
  for (int i : {p.w1, p.w2, p.w3}) gr.touch(i, false);   // the experts' gradients, fetched up front
  double dxe = m.alloc(s.Me * d * e), dgab = m.alloc(3 * s.Me * s.Fe * e);
  for (int i : {p.w2, p.w1, p.w3}) gr.ready(i);
  m.free(b.a);
  m.free(b.b);
  m.free(b.g);
  m.free(b.xe);
  m.free(dye);
  double dxt = 0;
  if (!ep) {
    dxt = dxe;
    dxe = 0;
  } else {
    double dxr = m.alloc(s.Me * d * e);
    dxt = m.alloc(s.M * d * e);
    m.free(dxr);
    m.free(dxe);
  }
  double dy2 = m.alloc(N * d * e);
  m.free(dxt);
  double dlogits = m.alloc(N * s.E * e), dyr = m.alloc(N * d * e);
  gr.touch(p.router, false);
  gr.ready(p.router);
  for (double* t : {&b.probs, &b.lse, &b.experts, &b.gates, &b.slot, &b.perm}) m.free(*t);
  for (double* t : {&dgates, &dgab, &dlogits, &dyr}) m.free(*t);
  // transformer.cpp: ln2's gradient added to dx through the norm, then y2 and h dropped.
  gr.touch(p.ln2);
  m.free(b.y2);
  m.free(b.h);
  m.free(dy2);
}

}  // namespace lmscale::jobs::replay
