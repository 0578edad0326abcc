#include "lmscale/jobs/bench_model.h"
#include "lmscale/jobs/engine/fp8_report.h"
#include "lmscale/jobs/engine/expert_rebalance.h"
#include "lmscale/jobs/engine/moe_report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "lmscale/core/cpu_model.h"
#include "lmscale/core/host_memory.h"
#include "lmscale/core/host_vector.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/core/rng.h"
#include "lmscale/core/timer.h"
#include "lmscale/core/trace.h"
#include "lmscale/jobs/predict/accounting.h"
#include "lmscale/jobs/predict/device_peak.h"
#include "lmscale/jobs/predict/memory_model.h"
#include "lmscale/jobs/memory_report.h"
#include "lmscale/jobs/metrics_stream.h"
#include "lmscale/jobs/step_rates.h"
#include "lmscale/jobs/engine/pipeline_report.h"
#include "lmscale/jobs/resilience/step_watchdog.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/parallel/fsdp.h"

namespace lmscale::jobs {

namespace {

// Uniform random tokens [rows, T+1] for global rows [first, first+rows) of step `step`, like the
// peer's torch.randint: bench timings must not depend on data.
std::vector<std::int32_t> random_tokens(std::uint64_t seed, std::int64_t step, std::int64_t first, std::int64_t rows,
                                        std::int64_t T, std::int64_t vocab) {
  auto v = host_vector<std::int32_t>(static_cast<std::size_t>(rows * (T + 1)), "the benchmark token batch");
  for (std::int64_t r = 0; r < rows; ++r) {
    const CounterRng rng(seed, 0xbe9c0000ull + static_cast<std::uint64_t>(step) * 1000003ull + static_cast<std::uint64_t>(first + r));
    for (std::int64_t t = 0; t <= T; ++t)
      v[static_cast<std::size_t>(r * (T + 1) + t)] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(vocab)));
  }
  return v;
}

void put_stats(io::ResultsFile& out, const std::string& group, const std::string& phase, const Stats& s) {
  out.set_attr(group, phase + "_ms_mean", s.mean);
  out.set_attr(group, phase + "_ms_std", s.std);
  out.set_attr(group, phase + "_ms_min", s.min);
  out.set_attr(group, phase + "_ms_max", s.max);
  out.set_attr(group, phase + "_ms_median", s.median);
}

}  // namespace

int run_bench_model(JobEnv& env) {
  const Config& cfg = env.cfg;
  const BenchMode mode = cfg.bench.mode;
  const std::int64_t T = cfg.model.context_length;
  const std::int64_t B = cfg.bench.batch_size;
  ops::Runtime& rt = env.rt;
  if (cfg.bench.memory_timeline) rt.allocator().tracker().record_timeline(true);

  Trainer trainer(env, B, 1, cfg.bench.warmup + cfg.bench.steps);
  rt.synchronize();
  rt.allocator().tracker().mark_phase("init");
  const model::ModelDims& dims = trainer.dims();
  if (env.is_root()) {
    fmt::print("bench-model: {} parameters, batch {} x {} tokens, mode {}, precision {}, device {} ({})\n",
               dims.parameter_count(), B, T, mode, cfg.precision.mode, device_name(rt.device()), rt.device_name());
  }

  auto table = env.out.create_table("/bench_model/steps", {{"step", io::Column::Type::i64, ""},
                                                           {"forward_ms", io::Column::Type::f64, "ms"},
                                                           {"backward_ms", io::Column::Type::f64, "ms"},
                                                           {"comm_ms", io::Column::Type::f64, "ms"},
                                                           {"optimizer_ms", io::Column::Type::f64, "ms"},
                                                           {"total_ms", io::Column::Type::f64, "ms"},
                                                           {"loss", io::Column::Type::f64, "nats"}});
  PipelineRecorder pipe(env, trainer);   // parallel.pp > 1: bubble and timeline (/pipeline)
  // MoE models, in the modes that keep a forward's routing (train-step, forward-backward): the
  // assignments per expert of every step (/bench_model/moe), and how evenly the timed steps'
  // rows fell on the experts and the ep ranks (what ep's all-to-alls wait for: docs/moe.md).
  std::optional<MoeRecorder> moe;
  if (dims.moe() && mode != BenchMode::forward) {
    moe.emplace(env, trainer, "/bench_model/moe");
    moe->count_balance_from(cfg.bench.warmup + 1, static_cast<int>(cfg.parallel.ep));
  }
  ExpertRebalancer rebalancer(env, trainer, moe ? cfg.parallel.ep_rebalance_every : 0, "/bench_model/ep_placement");
  std::vector<double> fwd, bwd, comm, opt, total;
  const std::int64_t n_steps = cfg.bench.warmup + cfg.bench.steps;
  StepWatchdog watchdog(env, cfg.parallel.timeout_s);   // a stuck rank ends the job (parallel.timeout_s)
  // A line per step as it ends (docs/metrics.md), warm-up included (an 8b warm-up step takes
  // seconds); at most one a second when steps are short, the last timed step always.
  const double step_tokens = static_cast<double>(B * T);
  const double step_flops =
      (mode == BenchMode::forward ? dims.forward_flops_per_token(T) : dims.train_flops_per_token(T)) * step_tokens;
  const double device_peak = device_peak_flops(rt.device_name(), cfg.precision.mode, cfg.precision.tf32);
  const double device_bytes = device_memory_bytes(rt);
  WallTimer since_line;
  bool first_line = true;
  ops::Runtime::GemmPlanCounts gemm_before;   // at the first timed step
  GraphStats graphs_before;                   // train.cuda_graphs: at the first timed step
  // The wall clock at each step's start and at the loop's end: a timed step's period is the time
  // to the next step's start. The step times (below) end with the step's last work on the compute
  // stream; the period also holds the loop's own host work between steps and the work a step's
  // predecessor left running past its end (parallel.overlap_optimizer's update, parallel.offload's
  // host update), which this step's forward waits for. The first timed step so carries the last
  // warm-up step's, and the last timed step's own is left out, as a steady state's would be
  // (bench.warmup >= 1).
  WallTimer loop_clock;
  std::vector<double> starts_s;
  for (std::int64_t s = 0; s < n_steps; ++s) {
    starts_s.push_back(loop_clock.seconds());
    const bool timed = s >= cfg.bench.warmup;
    trace::ProfilerStep profiler_step(s + 1);   // run.trace: HTA's iteration (warm-up steps included)
    watchdog.mark(s, timed ? "timed step" : "warm-up step");
    if (s == cfg.bench.warmup && trainer.fsdp()) trainer.fsdp()->reset_waits();
    if (s == cfg.bench.warmup) gemm_before = rt.gemm_plan_counts();
    if (s == cfg.bench.warmup) graphs_before = trainer.graph_stats();
    NvtxRange range(timed ? "timed_step" : "warmup_step");
    auto tokens = random_tokens(cfg.run.seed, s, trainer.first_row(), trainer.local_rows(), T, dims.vocab);
    StepResult r;
    auto m0 = rt.mark();
    if (mode == BenchMode::forward) {
      r.loss = trainer.forward_loss(tokens, T, &r.times);
    } else if (mode == BenchMode::forward_backward) {
      r = trainer.forward_backward(tokens, T);
    } else {
      r = trainer.train_step(tokens, T);
    }
    auto m1 = rt.mark();
    rt.synchronize();
    r.times.total_ms = rt.elapsed_ms(m0, m1);
    if (moe) moe->record(s + 1);   // after the timing: one device read and one host all-reduce
    // parallel.ep_rebalance_every: in the warm-up only; the timed steps run the placement it left.
    if (moe && !timed && rebalancer.due(s + 1)) rebalancer.rebalance(s + 1, moe->last_rows());
    const StepRates rates = step_rates(step_tokens, step_flops, r.times.total_ms * 1e-3, env.world, device_peak);
    const double memory = static_cast<double>(rt.allocator().tracker().peak());
    if (cfg.run.progress && env.is_root() && (first_line || s + 1 == n_steps || since_line.seconds() >= 1.0)) {
      fmt::print("{} {:>4}/{}  {:.1f} ms  loss {:.4f}  memory {}  tok/s/gpu {:.0f}  TFLOP/s {}  MFU {}\n",
                 timed ? "timed step  " : "warm-up step", timed ? s - cfg.bench.warmup + 1 : s + 1,
                 timed ? cfg.bench.steps : cfg.bench.warmup, r.times.total_ms, r.loss,
                 memory_of_device(memory, device_bytes), rates.tokens_per_s_per_gpu, three_digits(rates.tflops_per_gpu),
                 percent_or_na(rates.mfu));
      std::fflush(stdout);
      since_line.reset();
      first_line = false;
    }
    if (!timed) continue;
    if (env.metrics)
      env.metrics->write("bench_step", {{"step", s - cfg.bench.warmup + 1},
                                        {"step_ms", r.times.total_ms},
                                        {"forward_ms", r.times.forward_ms},
                                        {"backward_ms", r.times.backward_ms},
                                        {"comm_ms", r.times.comm_ms},
                                        {"optimizer_ms", r.times.optimizer_ms},
                                        {"loss", r.loss},
                                        {"tokens_per_s_per_gpu", rates.tokens_per_s_per_gpu},
                                        {"tflops_per_gpu", rates.tflops_per_gpu},
                                        {"mfu", rates.mfu},
                                        {"memory_bytes", memory},
                                        {"memory_fraction", device_bytes > 0 ? memory / device_bytes : NAN}});
    if (mode != BenchMode::forward) pipe.add_step(s - cfg.bench.warmup);
    fwd.push_back(r.times.forward_ms);
    bwd.push_back(r.times.backward_ms);
    comm.push_back(r.times.comm_ms);
    opt.push_back(r.times.optimizer_ms);
    total.push_back(r.times.total_ms);
    table.append({s - cfg.bench.warmup + 1, r.times.forward_ms, r.times.backward_ms, r.times.comm_ms,
                  r.times.optimizer_ms, r.times.total_ms, r.loss});
    table.flush();
  }

  starts_s.push_back(loop_clock.seconds());
  trainer.settle_optimizer();   // what the last step left in flight, before the results are read
  rt.synchronize();
  std::vector<double> period;
  for (std::int64_t s = cfg.bench.warmup; s < n_steps; ++s)
    period.push_back(1e3 * (starts_s[static_cast<std::size_t>(s + 1)] - starts_s[static_cast<std::size_t>(s)]));
  const Stats st = summarize(total), sf = summarize(fwd), sb = summarize(bwd), sc = summarize(comm), so = summarize(opt);
  const Stats sp = summarize(period);
  const double tokens = static_cast<double>(B * T);   // global tokens per step
  const double flops = (mode == BenchMode::forward ? dims.forward_flops_per_token(T) : dims.train_flops_per_token(T)) * tokens;
  const double peak = device_peak_flops(rt.device_name(), cfg.precision.mode, cfg.precision.tf32) * env.world;
  const double achieved = flops / (st.mean * 1e-3);
  const double mfu = peak > 0 ? achieved / peak : std::numeric_limits<double>::quiet_NaN();
  // The same with causal attention counted as half the score matrix (the leaderboard's MFU).
  const double flops_causal =
      (mode == BenchMode::forward ? dims.train_flops_per_token_causal(T) / 3.0 : dims.train_flops_per_token_causal(T)) * tokens;
  const double mfu_causal = peak > 0 ? flops_causal / (st.mean * 1e-3) / peak : std::numeric_limits<double>::quiet_NaN();
  const MemoryTracker& mem = rt.allocator().tracker();

  {   // precision.mode = fp8: the scaling state after the timed steps (/bench_model/fp8)
    Fp8Recorder fp8(env, trainer, "/bench_model");
    fp8.record(cfg.bench.warmup + cfg.bench.steps);
    fp8.finish();
  }
  const std::string g = "/bench_model";
  put_stats(env.out, g, "total", st);
  put_stats(env.out, g, "forward", sf);
  put_stats(env.out, g, "backward", sb);
  put_stats(env.out, g, "comm", sc);
  put_stats(env.out, g, "optimizer", so);
  put_stats(env.out, g, "period", sp);
  env.out.set_attr(g, "mode", to_string(mode));
  env.out.set_attr(g, "precision", to_string(cfg.precision.mode));
  env.out.set_attr(g, "batch_size", B);
  env.out.set_attr(g, "context_length", T);
  env.out.set_attr(g, "parameters", dims.parameter_count());
  env.out.set_attr(g, "tokens_per_s", tokens / (st.mean * 1e-3));
  env.out.set_attr(g, "tokens_per_s_wall", tokens / (sp.mean * 1e-3));
  env.out.set_attr(g, "flops_per_step", flops);
  env.out.set_attr(g, "achieved_flops", achieved);
  env.out.set_attr(g, "peak_flops", peak);
  env.out.set_attr(g, "mfu", mfu);
  env.out.set_attr(g, "flops_per_step_causal", flops_causal);
  env.out.set_attr(g, "mfu_causal", mfu_causal);
  env.out.set_attr(g, "peak_bytes", static_cast<std::int64_t>(mem.peak()));
  // The host side (parallel.offload keeps optimizer state there): this rank's peak resident set.
  const double host_peak = process_peak_resident_bytes().value_or(std::numeric_limits<double>::quiet_NaN());
  env.out.set_attr(g, "host_peak_resident_bytes", host_peak);
  env.out.set_attr(g, "device_name", rt.device() == Device::cuda ? rt.device_name() : cpu_model_name());
  // Data-parallel accounting (docs/architecture.md §5): exposed communication = time from the end of the
  // backward until the gradients are ready; its share of the step.
  env.out.set_attr(g, "ranks", static_cast<std::int64_t>(env.world));
  // The GEMM plan cache over the timed steps (CUDA; ops/cuda/gemm.h): plans made per step cost a
  // cuBLASLt heuristic query each on the host, which a step of fixed shapes never repeats; an MoE
  // step's expert GEMMs change rows every step and should run on their shape classes' plans.
  double gemm_plans_per_step = 0;
  {
    const ops::Runtime::GemmPlanCounts now = rt.gemm_plan_counts();
    const double n = static_cast<double>(std::max<std::int64_t>(1, cfg.bench.steps));
    gemm_plans_per_step = static_cast<double>(now.plans_made - gemm_before.plans_made) / n;
    env.out.set_attr(g, "gemm_plans_made_per_step", gemm_plans_per_step);
    env.out.set_attr(g, "gemm_class_products_per_step",
                     static_cast<double>(now.class_products - gemm_before.class_products) / n);
    env.out.set_attr(g, "gemm_class_fallbacks_per_step",
                     static_cast<double>(now.class_fallbacks - gemm_before.class_fallbacks) / n);
    // model.moe_expert_gemm = grouped: that the grouped form ran, and what it could not group.
    env.out.set_attr(g, "gemm_grouped_calls_per_step",
                     static_cast<double>(now.grouped_calls - gemm_before.grouped_calls) / n);
    env.out.set_attr(g, "gemm_grouped_looped_products_per_step",
                     static_cast<double>(now.grouped_looped_products - gemm_before.grouped_looped_products) / n);
    // model.moe_expert_gemm = wgmma: that our grouped GEMM ran (0: the form fell back to the loop).
    env.out.set_attr(g, "gemm_sm90_grouped_calls_per_step",
                     static_cast<double>(now.sm90_grouped_calls - gemm_before.sm90_grouped_calls) / n);
  }
  // train.cuda_graphs (docs/architecture.md §5): whether the step was captured, and how many timed
  // steps ran as a replay (all of them once bench.warmup >= 2: a shape's first step is eager, its
  // second is captured); the graph's nodes and the bytes its allocator pool reserves.
  {
    const GraphStats now = trainer.graph_stats();
    env.out.set_attr(g, "cuda_graphs", static_cast<std::int64_t>(trainer.cuda_graphs() ? 1 : 0));
    env.out.set_attr(g, "cuda_graph_replayed_steps", now.replays - graphs_before.replays);
    env.out.set_attr(g, "cuda_graph_captures", now.captures);
    env.out.set_attr(g, "cuda_graph_nodes", static_cast<std::int64_t>(now.nodes));
    env.out.set_attr(g, "cuda_graph_pool_bytes", static_cast<std::int64_t>(now.pool_bytes));
  }
  env.out.set_attr(g, "ddp", to_string(cfg.parallel.ddp));
  env.out.set_attr(g, "zero", to_string(cfg.parallel.zero));
  env.out.set_attr(g, "bucket_mb", cfg.parallel.bucket_mb);
  env.out.set_attr(g, "activation_checkpointing", to_string(cfg.train.activation_checkpointing));
  env.out.set_attr(g, "checkpoint_k", cfg.train.checkpoint_k);
  // FSDP: how long the compute waited for each unit's all-gather, per timed step (forward and
  // backward): 0 means the prefetch hid the gather behind the previous units' compute.
  double fsdp_wait_fwd = 0, fsdp_wait_bwd = 0;
  if (auto* f = trainer.fsdp()) {
    const auto& w = f->waits();
    const double n = std::max<double>(1.0, static_cast<double>(w.steps));
    auto waits = env.out.create_table("/bench_model/fsdp_waits", {{"unit", io::Column::Type::i64, ""},
                                                                   {"forward_wait_ms", io::Column::Type::f64, "ms"},
                                                                   {"backward_wait_ms", io::Column::Type::f64, "ms"}});
    for (int u = 0; u < f->num_units(); ++u) {
      const double a = w.forward_ms[static_cast<std::size_t>(u)] / n, b = w.backward_ms[static_cast<std::size_t>(u)] / n;
      waits.append({static_cast<std::int64_t>(u), a, b});
      fsdp_wait_fwd += a;
      fsdp_wait_bwd += b;
    }
    env.out.set_attr(g, "fsdp_forward_wait_ms", fsdp_wait_fwd);
    env.out.set_attr(g, "fsdp_backward_wait_ms", fsdp_wait_bwd);
    env.out.set_attr(g, "fsdp_prefetch", cfg.parallel.fsdp_prefetch);
    env.out.set_attr(g, "reshard_after_forward", static_cast<std::int64_t>(cfg.parallel.reshard_after_forward));
  }
  MoeRecorder::Balance balance;
  if (moe) {
    balance = moe->balance();
    env.out.set_attr(g, "moe_expert_rows_max_over_mean", balance.expert_max_over_mean);
    env.out.set_attr(g, "moe_ep_rank_rows_max_over_mean", balance.ep_rank_max_over_mean);
  }
  env.out.set_attr(g, "exposed_comm_share", st.mean > 0 ? sc.mean / st.mean : 0.0);
  env.out.set_attr(g, "compute_ms_mean", sf.mean + sb.mean + so.mean);
  const std::int64_t opt_bytes = static_cast<std::int64_t>(trainer.strategy().state_bytes());
  env.out.set_attr(g, "optimizer_state_bytes", opt_bytes);
  // The accounting prediction beside the measurement (docs/architecture.md §5).
  const Accounting pred = account(cfg, env.world, rt.device() == Device::cuda ? rt.device_name() : "");
  // The peak of the phases this mode runs, each phase beside its measured peak (memory_model.h).
  const double predicted_peak = write_memory_prediction(env);
  env.out.set_attr(g, "predicted_peak_bytes", predicted_peak);
  env.out.set_attr(g, "predicted_comm_bytes_per_step", pred.comm_bytes_per_step);
  env.out.set_attr(g, "predicted_offload_host_bytes", pred.host_bytes);
  env.out.set_attr(g, "predicted_offload_transfer_bytes_per_step", pred.host_transfer_bytes_per_step);
  // The accounting's step FLOPs (train step; both conventions) beside the measured time.
  env.out.set_attr(g, "predicted_flops_per_step", pred.flops_per_step);
  env.out.set_attr(g, "predicted_flops_per_step_causal", pred.flops_per_step_causal);
  env.out.set_attr(g, "predicted_ideal_step_ms", pred.ideal_step_s * 1e3);
  // Tensor parallelism: its activation collectives run inside the forward and backward (on the
  // compute stream's critical path), so their time is part of forward_ms/backward_ms, not comm.
  env.out.set_attr(g, "tp", cfg.parallel.tp);
  env.out.set_attr(g, "sequence_parallel", static_cast<std::int64_t>(cfg.parallel.sequence_parallel));
  env.out.set_attr(g, "predicted_tp_comm_bytes_per_step", pred.tp_comm_bytes_per_step);
  // Memory by allocation tag at three points of the last step, one row per (point, tag).
  auto memtab = env.out.create_table("/bench_model/memory", {{"point", io::Column::Type::str, ""},
                                                             {"tag", io::Column::Type::str, ""},
                                                             {"bytes", io::Column::Type::i64, "bytes"}});
  for (const auto& [point, tags] : trainer.memory_points())
    for (const auto& [tag, bytes] : tags) memtab.append({point, tag, static_cast<std::int64_t>(bytes)});
  pipe.write();
  write_memory_report(env);

  if (env.is_root()) {
    // median last: scripts read mean and std as columns 2 and 3.
    fmt::print("{:<12} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "phase(ms)", "mean", "std", "min", "max", "median");
    auto row = [](const char* n, const Stats& s) {
      fmt::print("{:<12} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f}\n", n, s.mean, s.std, s.min, s.max, s.median);
    };
    row("forward", sf);
    if (mode != BenchMode::forward) row("backward", sb);
    if (mode == BenchMode::train_step) {
      row("comm", sc);
      row("optimizer", so);
    }
    row("step", st);
    row("period", sp);   // wall clock from a step's start to the next's (the loop's host work included)
    if (env.world > 1)
      fmt::print("ranks {}  ddp {}  zero {}  exposed communication {:.1f}% of the step  optimizer state {:.3f} GiB/rank\n",
                 env.world, cfg.parallel.ddp, cfg.parallel.zero, st.mean > 0 ? 100 * sc.mean / st.mean : 0.0,
                 static_cast<double>(opt_bytes) / (1 << 30));
    if (cfg.parallel.tp > 1)
      fmt::print("tp {}{}: {:.3f} GiB of activation collectives per step per rank (inside forward/backward)\n",
                 cfg.parallel.tp, cfg.parallel.sequence_parallel ? " + sequence parallel" : "",
                 pred.tp_comm_bytes_per_step / (1u << 30));
    if (trainer.fsdp())
      fmt::print("fsdp: compute waited {:.3f} ms per step for all-gathers in the forward, {:.3f} ms in the backward "
                 "(/bench_model/fsdp_waits has each unit)\n",
                 fsdp_wait_fwd, fsdp_wait_bwd);
    fmt::print("predicted peak (accounting) {:.3f} GiB\n", predicted_peak / (1u << 30));
    if (balance.rows > 0)
      fmt::print("moe: the busiest expert got {:.2f}x the mean expert's rows{} (mean over the blocks and timed steps; "
                 "/bench_model/moe has the counts{})\n",
                 balance.expert_max_over_mean,
                 cfg.parallel.ep > 1 ? fmt::format(", the busiest ep rank {:.2f}x the mean rank's", balance.ep_rank_max_over_mean)
                                     : std::string(),
                 cfg.parallel.ep > 1 ? "; the planner takes the ep figure as plan.moe_rank_imbalance" : "");
    // A timed step that still makes GEMM plans is not yet the steady state (an MoE model's expert
    // rows reach new shape classes for its first ~20 steps: docs/moe.md).
    if (gemm_plans_per_step > 0)
      fmt::print("note: the timed steps made {:.1f} cuBLASLt plans each (heuristic queries, first kernel loads): "
                 "not yet the steady state; raise bench.warmup\n",
                 gemm_plans_per_step);
    if (pred.host_bytes > 0)
      fmt::print("offload: host peak resident {:.3f} GiB per rank (the offloaded state: {:.3f} GiB predicted)\n",
                 host_peak / (1u << 30), pred.host_bytes / (1u << 30));
    fmt::print("tokens/s {:.1f}  achieved {} TFLOP/s  MFU {} (causal FLOPs: {})  peak memory {:.3f} GiB\n",
               tokens / (st.mean * 1e-3), three_digits(achieved / 1e12),
               std::isnan(mfu) ? std::string("n/a") : fmt::format("{:.1f}%", 100 * mfu),
               std::isnan(mfu_causal) ? std::string("n/a") : fmt::format("{:.1f}%", 100 * mfu_causal),
               static_cast<double>(mem.peak()) / (1 << 30));
  }
  return 0;
}

}  // namespace lmscale::jobs
