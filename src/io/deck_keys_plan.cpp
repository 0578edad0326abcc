// The deck keys of the planner (run.job = plan, docs/planner.md) and of its calibration
// (run.job = calibrate): [plan], [cluster], [calibrate].
#include "deck_key_builders.h"

namespace lmscale::io::detail {

std::vector<DeckKey> plan_keys() {
  using R = FloatRange;
  const std::string preset = " 0 = the plan.cluster preset's value (docs/planner.md names its source).";
  return {
      // [plan]
      int_key("plan.gpus", LMSCALE_FIELD(plan.gpus), 0,
              "run.job = plan: GPUs of the planned run; the layout search enumerates dp x tp x pp of this count. "
              "0 = parallel.dp x tp x pp of the deck (parallel.dp = 0 counts as 1)."),
      int_key("plan.batch_size", LMSCALE_FIELD(plan.batch_size), 0,
              "run.job = plan: global batch of the planned step in sequences of model.context_length tokens; 0 = "
              "train.batch_size (bench-model decks: pass their bench.batch_size here)."),
      enum_key("plan.cluster", LMSCALE_FIELD(plan.cluster),
               "run.job = plan: the cluster description: 8 GPUs per node over NVLink, 400 Gb/s InfiniBand per GPU "
               "between nodes, H100 SXM 80 GB or H200 141 GB; the [cluster] keys override single figures."),
      string_key("plan.calibration", "path", LMSCALE_FIELD(plan.calibration),
                 "run.job = plan: the calibration file (GEMM and attention rates, op bandwidths, collective alpha and "
                 "beta) written by run.job = calibrate; empty = inputs/calibration/h100.ini or h200.ini by "
                 "plan.cluster, shipped with lmscale and built from the measurements of docs/performance.md."),
      bool_key("plan.search", LMSCALE_FIELD(plan.search),
               "run.job = plan: rank every layout of plan.gpus (dp x tp x pp, zero level, checkpointing, "
               "microbatches) by predicted tokens/s, those that do not fit last; false = the deck's layout only."),
      int_key("plan.top", LMSCALE_FIELD(plan.top), 1, "run.job = plan: layouts printed (all are written)."),
      int_key("plan.sweep_max_gpus", LMSCALE_FIELD(plan.sweep_max_gpus), 0,
              "run.job = plan: the sweep of predicted tokens/s per GPU against 1, 2, 4, ... GPUs up to this count, "
              "per layout family, at the deck's batch per GPU (/plan/sweep); 0 = no sweep."),
      float_key("plan.moe_rank_imbalance", LMSCALE_FIELD(plan.moe_rank_imbalance), R{1.0, 1e308, true, true},
                "run.job = plan, MoE models with parallel.ep > 1: the busiest ep rank's routed rows over the mean "
                "rank's; each block waits for its busiest rank, so the experts' products and the all-to-alls scale "
                "by it. 1 = balanced routing; bench-model measures it (/bench_model moe_ep_rank_rows_max_over_mean, "
                "docs/planner.md). Applies to every ep > 1 layout the search ranks."),
      // [cluster]
      int_key("cluster.gpus_per_node", LMSCALE_FIELD(cluster.gpus_per_node), 0,
              "run.job = plan: GPUs per node joined by NVLink;" + preset),
      float_key("cluster.bf16_tflops", LMSCALE_FIELD(cluster.bf16_tflops), R::non_negative(),
                "run.job = plan: dense bf16 peak per GPU, TFLOP/s; the calibration's rates scale by its ratio to "
                "the calibrated device's peak;" + preset),
      float_key("cluster.fp8_tflops", LMSCALE_FIELD(cluster.fp8_tflops), R::non_negative(),
                "run.job = plan: dense fp8 peak per GPU, TFLOP/s (reported, for MFU of fp8 runs elsewhere; lmscale "
                "computes in bf16);" + preset),
      float_key("cluster.hbm_gbs", LMSCALE_FIELD(cluster.hbm_gbs), R::non_negative(),
                "run.job = plan: HBM bandwidth per GPU, GB/s; memory-bound ops scale by its ratio to the "
                "calibrated device's;" + preset),
      float_key("cluster.memory_gib", LMSCALE_FIELD(cluster.memory_gib), R::non_negative(),
                "run.job = plan: device memory per GPU in GiB, as CUDA reports it; layouts whose predicted peak "
                "exceeds it do not fit;" + preset),
      float_key("cluster.intra_gbs", LMSCALE_FIELD(cluster.intra_gbs), R::non_negative(),
                "run.job = plan: intra-node bandwidth per GPU (ring bus bandwidth, GB/s); 0 = the calibration's "
                "measured beta, else the preset's."),
      float_key("cluster.intra_us", LMSCALE_FIELD(cluster.intra_us), R::non_negative(),
                "run.job = plan: intra-node latency per algorithm step, us; 0 = the calibration's measured alpha, "
                "else the preset's."),
      float_key("cluster.inter_gbs", LMSCALE_FIELD(cluster.inter_gbs), R::non_negative(),
                "run.job = plan: inter-node bandwidth per GPU (its NIC), GB/s;" + preset),
      float_key("cluster.inter_us", LMSCALE_FIELD(cluster.inter_us), R::non_negative(),
                "run.job = plan: inter-node latency per algorithm step, us;" + preset),
      // [calibrate]
      string_key("calibrate.output", "path", LMSCALE_FIELD(calibrate.output),
                 "run.job = calibrate: the calibration file written (plan.calibration reads it): GEMM and attention "
                 "rates, elementwise and optimizer bandwidth of this machine's device, collective alpha and beta "
                 "over the launched ranks (the bench.* collective sweep keys)."),
  };
}

}  // namespace lmscale::io::detail
