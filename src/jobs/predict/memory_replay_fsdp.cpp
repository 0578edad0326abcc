// The FSDP part of the allocation replay (memory_replay.h): parallel/fsdp.cpp's units, their
// gathered weights ahead of use and their full-size gradients until reduce-scattered, for one
// process's model or one pipeline stage's units.
#include <algorithm>
#include <cmath>

#include "lmscale/model/param_layout.h"
#include "memory_replay.h"

namespace lmscale::jobs::replay {

namespace {
// The fsdp state setup_fsdp returns, by offload mode (its comments).
double fsdp_state_bytes(const Grads& gr, const Shapes& s, double S, double norms, double slot, double states);
}  // namespace

double setup_fsdp(Grads& gr, const Config& cfg, const Shapes& s, int dp, const std::vector<int>& local) {
  gr.fsdp = true;
  gr.e = s.e;
  gr.dp = dp;
  gr.prefetch = static_cast<int>(cfg.parallel.fsdp_prefetch);
  gr.reshard = cfg.parallel.reshard_after_forward;
  gr.last = s.L + 1;
  gr.local = local;
  // Units numbered as in the whole model (FullyShardedDataParallel's constructor): 0 = embedding,
  // l + 1 = block l, L + 1 = head; a unit sums its parameters that this rank's store holds (a
  // stage's: the others are empty, size 0, never gathered), padded to dp shards.
  const auto sizes = param_sizes(s);
  const model::ParamIndex index = s.index();   // MoE blocks hold a router too
  gr.unit_padded.assign(static_cast<std::size_t>(s.L + 2), 0.0);
  gr.unit_of_param.clear();
  double norms = 0;   // the replicated norm weights the store holds
  for (int i = 0; i < index.count(); ++i) {
    const bool norm = index.is_norm(i);
    gr.unit_of_param.push_back(norm ? -1 : index.unit_of(i));
    if (!local.empty() && local[static_cast<std::size_t>(i)] < 0) continue;
    if (norm) norms += sizes[static_cast<std::size_t>(i)];
    else gr.unit_padded[static_cast<std::size_t>(index.unit_of(i))] += sizes[static_cast<std::size_t>(i)];
  }
  double S = 0;   // the shard: one 1/dp piece of every unit
  for (double& n : gr.unit_padded) {
    n = std::ceil(n / dp) * dp;
    S += n / dp;
  }
  gr.gathered.assign(gr.unit_padded.size(), 0);
  gr.full.assign(gr.unit_padded.size(), 0);
  gr.send.assign(gr.unit_padded.size(), 0);
  gr.staged.assign(gr.unit_padded.size(), 0);
  gr.fp8_blocks = s.fp8_weights;
  gr.pending.clear();
  gr.offloaded = cfg.parallel.offload != OffloadMode::none;
  gr.offloaded_params = cfg.parallel.offload == OffloadMode::optimizer_params;
  // The offloaded optimizer's two staging slots (parallel/offloaded_shards.h): fp32 gradients and
  // the 16-bit copy of the largest chunk (<= 32 Mi elements); pinned host memory on a GPU run.
  double slot = 0;
  for (const double n : gr.unit_padded) slot = std::max(slot, std::min(n / dp, 33554432.0));
  // fp32 state tensors per parameter: 2 for adamw and lamb (m, v), 1 for sgd and lars.
  const double states = cfg.optim.name == OptimizerName::sgd || cfg.optim.name == OptimizerName::lars ? 1.0 : 2.0;
  // master and gradient shard, the norms' master and gradients, both optimizers' state.
  // Offloaded (AdamW only): the shard's master and moments live on the host; the device keeps the
  // gradient shard and the master's compute-dtype copy, and the norms as without offload.
  // optimizer+params: no device copy either (the pinned host copy is host memory); each gather's
  // send buffer comes and goes with the gather (gather, wait).
  // FP8 gathers: each block unit's scales (parallel/fsdp_fp8_gather.h), amax [7], the G scale
  // groups' amax [G] and 2 x G 16-byte lines of scale and inverse, fp32 (G: the block's FP8 layers).
  const double G = s.fp8_weights ? static_cast<double>(model::kFp8GemmsPerBlock) : 0.0;
  const double fp8_scales = s.fp8_weights ? static_cast<double>(s.L) * (7 + G + 2 * G * 4) * 4 : 0.0;
  return fp8_scales + fsdp_state_bytes(gr, s, S, norms, slot, states);
}

namespace {
double fsdp_state_bytes(const Grads& gr, const Shapes& s, double S, double norms, double slot, double states) {
  if (gr.offloaded_params && s.cuda) return 4 * S + 4 * norms * 2 + 4 * norms * states;
  if (gr.offloaded && s.cuda) return 4 * S + s.e * S + 4 * norms * 2 + 4 * norms * states;
  // On CPU ranks the host is the device: the master and moments, the copy (e = 4 in fp32: a second
  // fp32 copy) and the staging all count.
  // optimizer+params: the pinned host copy [S] and the gradient slots only.
  if (gr.offloaded_params) return 4 * S * 2 + 4 * norms * 2 + 4 * (S + norms) * states + s.e * S + 2 * slot * 4;
  if (gr.offloaded) return 4 * S * 2 + 4 * norms * 2 + 4 * (S + norms) * states + s.e * S + 2 * slot * (4 + s.e);
  return 4 * S * 2 + 4 * norms * 2 + 4 * (S + norms) * states;
}
}  // namespace

void Grads::gather(int u) {
  const auto i = static_cast<std::size_t>(u);
  // An empty unit (another stage's) is never gathered (issue_gather).
  if (i >= gathered.size() || gathered[i] > 0 || unit_padded[i] <= 0) return;
  // The send buffer: the cast shard (mixed precision), or the shard copied up from the host
  // (optimizer+params, any dtype); none for offload = optimizer (the persistent device copy).
  double cast = 0;
  if ((e < 4 && !offloaded) || offloaded_params) cast = sim->alloc(e * unit_padded[i] / dp);
  const bool fp8 = fp8_blocks && u >= 1 && u < last;   // a block's unit: its e4m3 bytes travel
  if (fp8) {
    send[i] = sim->alloc(unit_padded[i] / dp);
    if (offloaded_params) staged[i] = cast;
    else sim->free(cast);   // the compute-dtype cast dies once cast to e4m3
  } else {
    send[i] = cast;
  }
  gathered[i] = sim->alloc((fp8 ? 1.0 : e) * unit_padded[i]);
}

void Grads::wait(int u) {
  sim->free(send[static_cast<std::size_t>(u)]);
  sim->free(staged[static_cast<std::size_t>(u)]);
}

void Grads::release(int u) {
  sim->free(gathered[static_cast<std::size_t>(u)]);
  sim->free(send[static_cast<std::size_t>(u)]);
  sim->free(staged[static_cast<std::size_t>(u)]);
}

void Grads::before_forward(int u) {
  if (!fsdp) return;
  for (int j = u; j <= std::min(u + prefetch, last); ++j) gather(j);
  wait(u);
}

void Grads::after_forward(int u) {
  if (fsdp && !(training && (!reshard || u == last))) release(u);
}

void Grads::before_backward(int u) {
  if (!fsdp) return;
  if (u > 0) gather(u);
  for (int j = u - 1; j >= std::max(1, u - prefetch); --j) gather(j);
  if (u > 0) wait(u);
}

void Grads::after_backward(int u) {
  if (!fsdp) return;
  release(u);
  auto& g = full[static_cast<std::size_t>(u)];
  if (g > 0) {
    // reduce_scatter: a later micro-batch's sum lands in a temporary shard, added once it arrives.
    const double temp = micro > 0 ? sim->alloc(4 * unit_padded[static_cast<std::size_t>(u)] / dp) : 0.0;
    pending.push_back(g + temp);
    g = 0;
  }
  while (pending.size() > 1) {
    sim->free(pending.front());
    pending.erase(pending.begin());
  }
}

}  // namespace lmscale::jobs::replay
