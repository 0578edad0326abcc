#include "lmscale/jobs/plan/layout_search.h"

#include <algorithm>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"
#include "lmscale/jobs/predict/memory_model.h"
#include "lmscale/parallel/spec.h"

namespace lmscale::jobs::plan {

namespace {

std::string family_of(const parallel::Spec& s) {
  std::string f = s.dp > 1 ? s.data_parallel_name() : "";
  if (f.rfind("ddp", 0) == 0) f = "ddp";
  if (s.tp > 1) f += f.empty() ? "tp" : "+tp";
  if (s.pp > 1) f += f.empty() ? "pp" : "+pp";
  if (s.ep > 1) f += f.empty() ? "ep" : "+ep";
  return f.empty() ? "one gpu" : f;
}

std::string describe(const Config& c, int gpus) {
  const parallel::Spec s = parallel::Spec::resolve(c.parallel, gpus);
  std::string out = s.describe(gpus);
  const Checkpointing ac = c.train.activation_checkpointing;
  if (c.parallel.offload != OffloadMode::none) out += fmt::format(", offload {}", c.parallel.offload);
  if (ac != Checkpointing::none) out += fmt::format(", {}", ac);
  if (s.pp > 1) out += fmt::format(", {} microbatches", c.parallel.microbatches);
  else if (c.train.grad_accum > 1) out += fmt::format(", grad_accum {}", c.train.grad_accum);
  return out;
}

}  // namespace

Config deck_layout(const Config& deck, std::int64_t batch, int gpus) {
  Config c = deck;
  c.run.job = JobKind::bench_model;
  c.bench.mode = BenchMode::train_step;
  c.bench.batch_size = batch;
  c.train.batch_size = batch;
  c.parallel.device = DeviceChoice::cuda;
  c.parallel.backend = BackendChoice::nccl;
  if (c.parallel.dp == 0) c.parallel.dp = std::max<std::int64_t>(1, gpus / (c.parallel.tp * c.parallel.pp));
  return c;
}

std::string layout_refusal(const Config& layout, int gpus) {
  Config run = layout;
  run.parallel.device = DeviceChoice::automatic;   // the planned run's devices, not this machine's
  run.parallel.backend = BackendChoice::automatic;
  try {
    io::validate(run, gpus);
  } catch (const UsageError& e) {
    return e.what();
  }
  return {};
}

Candidate evaluate_layout(const Config& layout, std::int64_t batch, int gpus, const Cluster& cluster,
                          const Calibration& cal) {
  Candidate k;
  k.cfg = layout;
  const parallel::Spec s = parallel::Spec::resolve(layout.parallel, gpus);
  k.dp = s.dp, k.tp = s.tp, k.pp = s.pp;
  k.family = family_of(s);
  k.layout = describe(layout, gpus);
  for (const MemoryPhases& stage : predict_stage_phases(layout, gpus, true))
    k.memory_bytes = std::max(k.memory_bytes, stage.peak);
  k.fits = k.memory_bytes <= cluster.memory_bytes;
  k.step = predict_step(layout, batch, gpus, cluster, cal);
  return k;
}

std::vector<Candidate> search_layouts(const Config& deck, std::int64_t batch, int gpus, const Cluster& cluster,
                                      const Calibration& cal, const SearchSpace& space) {
  std::vector<Candidate> out;
  const Config base = deck_layout(deck, batch, gpus);
  const std::int64_t heads = deck.model.num_heads, layers = deck.model.num_layers;
  std::vector<Checkpointing> policies{Checkpointing::none, Checkpointing::every_k};
  if (space.checkpointing) policies.insert(policies.begin() + 1, Checkpointing::selective);
  for (int tp = 1; tp <= std::min(gpus, cluster.gpus_per_node); tp *= 2) {
    if (gpus % tp != 0 || heads % tp != 0) continue;
    for (int pp = 1; pp <= std::min<int>(space.max_pp, gpus / tp); pp *= 2) {
      if ((gpus / tp) % pp != 0 || pp > layers) continue;
      const int dp = gpus / (tp * pp);
      if (batch % dp != 0) continue;
      const std::int64_t per_dp = batch / dp;
      std::vector<ZeroLevel> zeros{ZeroLevel::none};
      if (dp > 1) zeros = {ZeroLevel::none, ZeroLevel::zero1, ZeroLevel::zero2, ZeroLevel::fsdp};
      std::vector<std::int64_t> micro{1};
      if (pp > 1) {
        micro.clear();
        for (std::int64_t mb : {pp, 2 * pp, 4 * pp})
          if (per_dp % mb == 0) micro.push_back(mb);
      } else if (space.accumulation) {
        for (std::int64_t ga : {2, 4, 8})
          if (per_dp % ga == 0) micro.push_back(ga);
      }
      // Expert parallelism for an MoE model: ep dividing dp and the expert count.
      std::vector<int> eps{1};
      for (int ep = 2; ep <= dp; ep *= 2)
        if (dp % ep == 0 && deck.model.moe_experts % ep == 0) eps.push_back(ep);
      // Pipelines: 1F1B and ZB-H1 (more memory: its deferred weight gradients' inputs; the
      // memory replay judges whether they fit).
      std::vector<PipelineSchedule> schedules{PipelineSchedule::one_f_one_b};
      if (pp > 1) schedules.push_back(PipelineSchedule::zb_h1);
      std::vector<bool> sps{false};
      if (tp > 1 && space.sequence_parallel) sps.push_back(true);
      // fsdp also with its optimizer offloaded to host memory (parallel.offload), where the
      // calibration has the host AdamW's rate.
      std::vector<std::pair<ZeroLevel, OffloadMode>> modes;
      for (ZeroLevel z : zeros) {
        modes.emplace_back(z, OffloadMode::none);
        if (z == ZeroLevel::fsdp && cal.host_adamw_bytes_per_s > 0) modes.emplace_back(z, OffloadMode::optimizer);
      }
      for (const auto& [z, offload] : modes)
        for (Checkpointing ac : policies)
          for (std::int64_t mb : micro)
            for (PipelineSchedule schedule : schedules)
              for (bool sp : sps)
                for (int ep : eps) {
                  Config c = base;
                  c.parallel.dp = dp, c.parallel.tp = tp, c.parallel.pp = pp, c.parallel.ep = ep;
                  c.parallel.zero = z;
                  c.parallel.offload = offload;
                  // fsdp reduce-scatters its gradients itself (no DDP kind); the others bucket them.
                  c.parallel.ddp = dp > 1 && z != ZeroLevel::fsdp ? DdpKind::bucketed : DdpKind::none;
                  c.parallel.grad_exchange = GradExchange::nccl;
                  c.parallel.ep_exchange = EpExchange::nccl;   // (the step model knows NCCL's all-to-all only)
                  c.parallel.sequence_parallel = sp;
                  c.parallel.schedule = schedule;
                  c.parallel.virtual_stages = 1;
                  c.parallel.stage_layers.clear();
                  c.parallel.microbatches = pp > 1 ? mb : 1;
                  c.train.grad_accum = pp > 1 ? 1 : mb;
                  c.train.activation_checkpointing = ac;
                  c.train.checkpoint_k = 1;
                  c.train.checkpoint_layers = 0;
                  c.train.checkpoint_keep_attention = false;
                  if (!layout_refusal(c, gpus).empty()) continue;
                  out.push_back(evaluate_layout(c, batch, gpus, cluster, cal));
                }
    }
  }
  return out;
}

void rank_layouts(std::vector<Candidate>& layouts) {
  std::stable_sort(layouts.begin(), layouts.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (a.fits) return a.step.tokens_per_s_per_gpu > b.step.tokens_per_s_per_gpu;
    return a.memory_bytes < b.memory_bytes;
  });
}

}  // namespace lmscale::jobs::plan
