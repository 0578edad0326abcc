// The mixture-of-experts keys (model.moe_*, parallel.ep) against each other, the layout and the
// device (docs/moe.md). Each failure is one UsageError naming the key and the fix (exit 2).
#include <fmt/format.h>

#include "deck_validate.h"
#include "lmscale/core/error.h"

namespace lmscale::io::detail {

namespace {

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw UsageError(fmt::format(format, std::forward<Args>(args)...));
}

bool runs_model(const Config& c) {
  return c.run.job == JobKind::train || c.run.job == JobKind::bench_model || c.run.job == JobKind::prune;
}

}  // namespace

void check_moe(const Config& c, int world_size) {
  const auto& m = c.model;
  const auto& p = c.parallel;
  // parallel.ep_exchange = copy-engine moves the rows of expert parallelism's all-to-alls; without
  // ep > 1 there are none. (Ranks on several nodes, or GPUs without peer access, are refused when
  // the exchange is set up: comm/peer_copy.h.)
  if (p.ep_exchange == EpExchange::copy_engine && runs_model(c)) {
    if (p.ep <= 1)
      fail("parallel.ep_exchange = copy-engine moves the MoE blocks' token rows between expert-parallel GPUs, but "
           "parallel.ep = {}: there are none to move; set parallel.ep_exchange = nccl, or parallel.ep > 1 (with "
           "model.moe_experts > 0)",
           p.ep);
    if (p.device == DeviceChoice::cpu || p.backend == BackendChoice::mpi)
      fail("parallel.ep_exchange = copy-engine moves the token rows between GPUs with their copy engines, but this "
           "run uses parallel.device = {} and parallel.backend = {}; set parallel.ep_exchange = nccl, or run on cuda "
           "with the nccl backend",
           p.device, p.backend);
  }
  // parallel.ep_rebalance_every relabels the experts over the ep ranks: it needs them split.
  if (p.ep_rebalance_every > 0 && runs_model(c)) {
    if (p.ep <= 1)
      fail("parallel.ep_rebalance_every = {} evens the expert-parallel ranks' rows, but parallel.ep = {}: there is one "
           "rank; set parallel.ep_rebalance_every = 0, or parallel.ep > 1 (with model.moe_experts > 0)",
           p.ep_rebalance_every, p.ep);
    if (c.run.job == JobKind::bench_model && p.ep_rebalance_every > c.bench.warmup)
      fail("parallel.ep_rebalance_every = {} with bench.warmup = {}: bench-model relabels the experts in its warm-up "
           "steps only (the timed steps measure the placement they leave), so it would never run; choose "
           "parallel.ep_rebalance_every <= {} or more warm-up steps",
           p.ep_rebalance_every, c.bench.warmup, c.bench.warmup);
  }
  if (m.moe_experts == 0) {
    if (p.ep > 1)
      fail("parallel.ep = {} splits the experts of MoE blocks, but model.moe_experts = 0 (a dense model); set "
           "parallel.ep = 1 or model.moe_experts > 0",
           p.ep);
    return;
  }
  const std::int64_t E = m.moe_experts;
  if (m.moe_top_k > E)
    fail("model.moe_top_k = {} exceeds model.moe_experts = {}; choose model.moe_top_k between 1 and {}", m.moe_top_k,
         E, E);
  if (m.moe_every > m.num_layers)
    fail("model.moe_every = {} exceeds model.num_layers = {}: no block would be MoE; choose model.moe_every between 1 "
         "and {}",
         m.moe_every, m.num_layers, m.num_layers);
  if (E % p.ep != 0)
    fail("parallel.ep = {} does not divide model.moe_experts = {}; every expert-parallel rank holds an equal number "
         "of experts: choose parallel.ep dividing {}",
         p.ep, E, E);
  // The accounting job describes any layout on any device; the others run the model.
  if (!runs_model(c)) return;
  // MoE runs on CPUs and GPUs alike (docs/moe.md); the GPU-only copy-engine gradient exchange
  // has not been built for the expert_dp group of expert parallelism.
  if (p.ep > 1 && p.grad_exchange == GradExchange::copy_engine)
    fail("parallel.grad_exchange = copy-engine with parallel.ep = {}: the copy-engine exchange over the expert-"
         "parallel layout's groups is not built; set parallel.grad_exchange = nccl, or parallel.ep = 1",
         p.ep);
  if (c.run.job == JobKind::prune)
    fail("model.moe_experts = {} with run.job = prune: pruning of expert weights is not built; use a dense model "
         "(model.moe_experts = 0)",
         E);
  if (p.tp > 1)
    fail("model.moe_experts = {} with parallel.tp = {}: tensor parallelism of MoE blocks is not built; set "
         "parallel.tp = 1 (split the experts with parallel.ep instead)",
         E, p.tp);
  if (p.pp > 1)
    fail("model.moe_experts = {} with parallel.pp = {}: pipeline stages of an MoE model are not built (the router "
         "losses of earlier stages would have to reach the last stage's loss); set parallel.pp = 1",
         E, p.pp);
  const auto ck = c.train.activation_checkpointing;
  if (ck == Checkpointing::selective || ck == Checkpointing::selective_mlp)
    fail("train.activation_checkpointing = {} with model.moe_experts = {}: the selective policies do not know the "
         "expert activations; use none or every-k (which recomputes whole blocks, routing included)",
         ck, E);
  const std::int64_t dp = resolved_dp(c, world_size);
  if (dp % p.ep != 0)
    fail("parallel.ep = {} does not divide parallel.dp = {}: expert parallelism runs inside the data-parallel group; "
         "choose parallel.ep dividing {} (or launch more ranks)",
         p.ep, dp, dp);
  if (p.ep > 1 && (c.optim.name == OptimizerName::lamb || c.optim.name == OptimizerName::lars))
    fail("parallel.ep = {} with optim.name = {}: a layer-wise optimizer needs each stacked expert tensor's norm, which "
         "expert parallelism splits over ranks; use optim.name = adamw or sgd, or parallel.ep = 1",
         p.ep, c.optim.name);
  if (p.ep > 1 && p.offload != OffloadMode::none)
    fail("parallel.ep = {} with parallel.offload = {}: the host optimizer of expert-parallel ranks is not built; set "
         "parallel.offload = none or parallel.ep = 1",
         p.ep, p.offload);
}

}  // namespace lmscale::io::detail
