// The interleaved 1F1B plan (parallel/interleaved_schedule.h): Megatron-LM's
// forward_backward_pipelining_with_interleaving with the compute and the communication points
// written down instead of run, so the same plan drives the pipeline and the tests.
#include "lmscale/parallel/interleaved_schedule.h"

#include <algorithm>

#include "lmscale/core/error.h"

namespace lmscale::parallel {

namespace {
int mod(int a, int n) { return ((a % n) + n) % n; }
}  // namespace

int interleaved_forward_chunk(int k, int p, int V) { return mod(k, p * V) / p; }
int interleaved_backward_chunk(int k, int p, int V) { return V - 1 - interleaved_forward_chunk(k, p, V); }
int interleaved_microbatch(int k, int p, int V) { return (k / (p * V)) * p + k % p; }

std::vector<InterleavedStep> interleaved_plan(int p, int V, int M, int s) {
  LMSCALE_CHECK(p >= 1 && V >= 1 && M >= 1 && s >= 0 && s < p,
                "interleaved plan: {} stages, {} chunks, {} microbatches, stage {}", p, V, M, s);
  LMSCALE_CHECK(M % p == 0, "interleaved: {} microbatches is not a multiple of {} stages", M, p);
  using Kind = InterleavedStep::Kind;
  const int total = M * V;
  auto fchunk = [&](int k) { return interleaved_forward_chunk(k, p, V); };
  auto bchunk = [&](int k) { return interleaved_backward_chunk(k, p, V); };
  auto first_virtual = [&](int c) { return s == 0 && c == 0; };
  auto last_virtual = [&](int c) { return s == p - 1 && c == V - 1; };
  std::vector<InterleavedStep> plan;
  // A forward returns what it sends (its k), or -1 on the last virtual stage (the loss).
  auto fwd = [&](int k) {
    plan.push_back({Kind::forward, k});
    return last_virtual(fchunk(k)) ? -1 : k;
  };
  // A backward returns what it sends, or -1 on virtual stage 0 (the embedding).
  auto bwd = [&](int k) {
    plan.push_back({Kind::backward, k});
    return first_virtual(bchunk(k)) ? -1 : k;
  };
  auto exchange = [&](int out, int in_chunk, int dx, int grad_chunk) {
    InterleavedStep e;
    e.send_output_of = out;
    e.recv_input_chunk = in_chunk;
    e.send_grad_of = dx;
    e.recv_grad_chunk = grad_chunk;
    plan.push_back(e);
  };

  // Megatron's warm-up: enough forwards that every rank's first backward finds its gradient.
  const int warmup = std::min(total, (p - s - 1) * 2 + (V - 1) * p);
  const bool all_warmup = warmup == total;
  const int remaining = total - warmup;
  if (!first_virtual(0)) exchange(-1, 0, -1, -1);
  for (int k = 0; k < warmup; ++k) {
    const int out = fwd(k);
    const int nc = fchunk(k + 1);
    const bool recv_prev = !(s == 0 && nc == 0) && k + 1 < total;
    const bool recv_next = k == warmup - 1 && !all_warmup && s != p - 1;
    exchange(out, recv_prev ? nc : -1, -1, recv_next ? V - 1 : -1);
  }
  // Steady state: forward fk, backward bk, one communication point for both.
  for (int i = 0; i < remaining; ++i) {
    const int fk = i + warmup, bk = i;
    const int out = fwd(fk);
    const int dx = bwd(bk);
    // Rank 0's next input comes from rank p-1's forward p-1 steps back (the ring), none when
    // that was the last chunk; likewise rank p-1's next gradient from rank 0's backward.
    bool recv_prev = true;
    int nfc = 0;
    if (s == 0) {
      nfc = fchunk(fk - (p - 1));
      if (nfc == V - 1) recv_prev = false;
      nfc += 1;
    } else {
      nfc = fchunk(fk + 1);
    }
    bool recv_next = true;
    int nbc = 0;
    if (s == p - 1) {
      nbc = bchunk(bk - (p - 1));
      if (nbc == 0) recv_next = false;
      nbc -= 1;
    } else {
      nbc = bchunk(bk + 1);
    }
    if (i == remaining - 1) recv_prev = false;
    exchange(out, recv_prev ? nfc : -1, dx, recv_next ? nbc : -1);
  }
  if (all_warmup && s != p - 1) exchange(-1, -1, -1, V - 1);
  // Cool-down: the remaining backwards.
  for (int k = remaining; k < total; ++k) {
    const int dx = bwd(k);
    const int nbc = bchunk(k + 1);
    const bool recv_next = !(s == p - 1 && nbc == V - 1) && k + 1 < total;
    exchange(-1, -1, dx, recv_next ? nbc : -1);
  }
  return plan;
}

}  // namespace lmscale::parallel
