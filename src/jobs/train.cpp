#include "lmscale/jobs/train.h"
#include "lmscale/parallel/spec.h"

#include <cmath>

#include <fmt/format.h>

#include "lmscale/core/host_vector.h"
#include "lmscale/core/nvtx.h"
#include "lmscale/core/timer.h"
#include "lmscale/core/trace.h"
#include "lmscale/io/dataset.h"
#include "lmscale/jobs/engine/checkpointing.h"
#include "lmscale/jobs/memory_report.h"
#include "lmscale/jobs/metrics_stream.h"
#include "lmscale/jobs/predict/device_peak.h"
#include "lmscale/jobs/step_rates.h"
#include "lmscale/jobs/engine/fp8_report.h"
#include "lmscale/jobs/engine/expert_rebalance.h"
#include "lmscale/jobs/engine/moe_report.h"
#include "lmscale/jobs/engine/pipeline_report.h"
#include "lmscale/jobs/resilience/fault_injection.h"
#include "lmscale/jobs/resilience/preemption.h"
#include "lmscale/jobs/engine/sharded_checkpointing.h"
#include "lmscale/jobs/resilience/step_watchdog.h"
#include "lmscale/jobs/engine/trainer.h"

namespace lmscale::jobs {

namespace {

std::string eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  return s >= 3600 ? fmt::format("{}h{:02}m", s / 3600, (s / 60) % 60) : fmt::format("{}m{:02}s", s / 60, s % 60);
}

// Mean loss over cfg.train.eval_batches held-out global batches (same batches every time).
double evaluate(const Config& cfg, Trainer& trainer, const io::TokenSource& data) {
  const std::int64_t T = cfg.model.context_length;
  double sum = 0;
  for (std::int64_t b = 0; b < cfg.train.eval_batches; ++b) {
    auto tokens = host_vector<std::int32_t>(static_cast<std::size_t>(trainer.local_rows() * (T + 1)),
                                            "the evaluation token batch");
    data.sample(static_cast<std::uint64_t>(b), trainer.first_row(), trainer.local_rows(), T, tokens.data(), true);
    sum += trainer.forward_loss(tokens, T);
  }
  return sum / static_cast<double>(cfg.train.eval_batches);
}

}  // namespace

namespace {

// The optimizer and the learning rate it really runs with (optim.reference_batch's linear
// scaling applied): printed at start, stored as /train attributes.
void print_optimizer_line(const Config& cfg, const Trainer& trainer) {
  const auto& o = cfg.optim;
  fmt::print("optimizer: {}, lr {:.3e} (min {:.3e}){}, warmup {} steps, global batch {} sequences = {} per rank x {} "
             "data-parallel ranks, in {} micro-batches each\n",
             o.name, o.lr * trainer.lr_scale(), o.min_lr * trainer.lr_scale(),
             o.reference_batch > 0 ? fmt::format(" = {:.3e} x {} / reference_batch {}", o.lr, cfg.train.batch_size,
                                                 o.reference_batch)
                                   : std::string(),
             o.warmup_steps, cfg.train.batch_size, trainer.local_rows(), trainer.dp_size(), cfg.train.grad_accum);
}

void store_optimizer_attrs(JobEnv& env, const Config& cfg, const Trainer& trainer) {
  env.out.set_attr("/train", "optimizer", to_string(cfg.optim.name));
  env.out.set_attr("/train", "lr_effective", cfg.optim.lr * trainer.lr_scale());
  env.out.set_attr("/train", "min_lr_effective", cfg.optim.min_lr * trainer.lr_scale());
  env.out.set_attr("/train", "lr_scale", trainer.lr_scale());
  env.out.set_attr("/train", "reference_batch", cfg.optim.reference_batch);
  env.out.set_attr("/train", "global_batch", cfg.train.batch_size);
  env.out.set_attr("/train", "grad_accum", cfg.train.grad_accum);
  env.out.set_attr("/train", "tokens_per_step", cfg.train.batch_size * cfg.model.context_length);
}

}  // namespace

int run_train(JobEnv& env) {
  const Config& cfg = env.cfg;
  const std::int64_t T = cfg.model.context_length;
  ops::Runtime& rt = env.rt;
  // From here on SIGTERM/SIGUSR1 stop the run at the next step boundary (none during the setup).
  PreemptionWatch preemption;
  auto data = io::make_token_source(cfg.data, cfg.model.vocab_size, cfg.run.seed);
  Trainer trainer(env, cfg.train.batch_size, cfg.train.grad_accum, cfg.train.steps);
  std::string resumed_from;
  std::optional<std::string> fp8_state_missing;   // why delayed FP8 scaling restarts its histories
  if (const auto dir = resume_directory(env)) {
    fp8_state_missing = load_sharded_checkpoint(env, trainer, *dir);
    resumed_from = *dir;
  } else if (!cfg.train.resume.empty() && cfg.train.resume != "auto") {
    fp8_state_missing = load_checkpoint(env, trainer, cfg.train.resume);
    resumed_from = cfg.train.resume;
  }
  move_aside_newer_checkpoints(env, trainer.step());   // train.on_newer_checkpoints = move-aside
  // Sharded checkpoints (train.checkpoint_dir) or the single file train.checkpoint_path.
  const bool sharded_checkpoints = !cfg.train.checkpoint_dir.empty();
  std::int64_t checkpointed_at = trainer.step();   // a resumed run's step is already saved
  StepWatchdog watchdog(env, cfg.parallel.timeout_s);   // a stuck rank ends the job (parallel.timeout_s)
  auto write_checkpoint = [&] {
    watchdog.mark(trainer.step(), "checkpoint");
    if (sharded_checkpoints)
      save_sharded_checkpoint(env, trainer);
    else
      save_weights(env, trainer, cfg.train.checkpoint_path, true);
    checkpointed_at = trainer.step();
  };
  rt.synchronize();
  rt.allocator().tracker().mark_phase("init");
  const auto& dims = trainer.dims();
  if (env.is_root()) {
    fmt::print("train: {} parameters ({} layers, d_model {}), {} steps of {} x {} tokens, {} on {}, data: {}\n",
               dims.parameter_count(), dims.layers, dims.d_model, cfg.train.steps, cfg.train.batch_size, T,
               cfg.precision.mode, rt.device_name(), data->describe());
    if (dims.moe())
      fmt::print("moe: {} experts, top-{}, expert d_ff {}, {} of {} blocks; {} active parameters per token; capacity "
                 "factor {}{}\n",
                 dims.moe_experts, dims.moe_top_k, dims.moe_dff, dims.moe_block_count(), dims.layers,
                 dims.active_parameter_count(), dims.moe_capacity_factor > 0 ? fmt::format("{}", dims.moe_capacity_factor)
                                                                              : std::string("0 (dropless)"),
                 cfg.parallel.ep > 1 ? fmt::format("; experts split over ep {} ranks ({} each), layout {}", cfg.parallel.ep,
                                                   dims.moe_experts / cfg.parallel.ep,
                                                   parallel::Spec::resolve(cfg.parallel, env.world).describe(env.world))
                                     : std::string());
    if (!resumed_from.empty()) fmt::print("resumed from {} at step {}\n", resumed_from, trainer.step());
    // Checkpoints hold delayed FP8 scaling's state per rank (docs/checkpoints.md); where this one
    // cannot give it, the histories start empty and the run differs from an uninterrupted one.
    if (fp8_state_missing)
      fmt::print(stderr, "lmscale: warning: precision.fp8_scaling = delayed: {}. The resumed run starts the amax "
                         "histories empty (its first casts use scale 1) and differs from an uninterrupted run\n",
                 *fp8_state_missing);
    if (!resumed_from.empty() && trainer.step() >= cfg.train.steps)
      fmt::print("train: the checkpoint is at the end (train.steps = {}): the run is complete, nothing to train "
                 "(raise train.steps to continue it)\n",
                 cfg.train.steps);
    print_optimizer_line(cfg, trainer);
  }
  using C = io::Column;
  auto steps = env.out.create_table("/train/steps", {{"step", C::Type::i64, ""},
                                                     {"loss", C::Type::f64, "nats"},
                                                     {"lr", C::Type::f64, ""},
                                                     {"grad_norm", C::Type::f64, ""},
                                                     {"step_ms", C::Type::f64, "ms"},
                                                     {"forward_ms", C::Type::f64, "ms"},
                                                     {"backward_ms", C::Type::f64, "ms"},
                                                     {"comm_ms", C::Type::f64, "ms"},
                                                     {"optimizer_ms", C::Type::f64, "ms"},
                                                     {"tokens_per_s", C::Type::f64, "tokens/s"},
                                                     {"loss_scale", C::Type::f64, ""},
                                                     {"skipped", C::Type::i64, ""},
                                                     {"memory_bytes", C::Type::i64, "bytes"}});
  auto evals = env.out.create_table("/train/eval", {{"step", C::Type::i64, ""}, {"loss", C::Type::f64, "nats"}});
  store_optimizer_attrs(env, cfg, trainer);

  const double tokens_per_step = static_cast<double>(cfg.train.batch_size * T);
  // Progress lines and the metrics stream (docs/metrics.md): rates per GPU over the steps since the
  // previous logged step, model FLOPs as bench-model counts them, memory as the allocator's peak.
  const double flops_per_step = dims.train_flops_per_token(T) * tokens_per_step;
  const double peak_flops = device_peak_flops(rt.device_name(), cfg.precision.mode, cfg.precision.tf32);
  const double device_bytes = device_memory_bytes(rt);
  WallTimer since_log;
  // cost.price_per_gpu_hour > 0: money to finish (and in all, this run's steps only) at the
  // current pace, every rank counted as one GPU (docs/recipes.md "Cost").
  const double price = cfg.cost.price_per_gpu_hour * (1.0 - cfg.cost.spot_discount);
  auto money = [&](double seconds) { return seconds / 3600.0 * static_cast<double>(env.world) * price; };
  auto cost_to_finish = [&](double remaining_s, double total_s) {
    return fmt::format("  cost to finish {:.4g} ({:.4g} in all)", money(remaining_s), money(total_s));
  };
  PipelineRecorder pipe(env, trainer);   // parallel.pp > 1: bubble and timeline (/pipeline)
  MoeRecorder moe(env, trainer);         // MoE blocks: tokens per expert, drops, router losses (/train/moe)
  // parallel.ep_rebalance_every: the experts relabelled to even the ep ranks (/train/ep_placement).
  ExpertRebalancer rebalancer(env, trainer, cfg.parallel.ep_rebalance_every, "/train/ep_placement");
  Fp8Recorder fp8(env, trainer, "/train");   // precision.mode = fp8: amaxes and scales (/train/fp8)
  WallTimer wall;
  double first_loss = NAN, last_loss = NAN;
  const std::int64_t start = trainer.step();
  std::int64_t logged_at = start;   // the step count at the previous progress line
  bool interrupted = false;
  // train.max_skipped_steps: consecutive skipped or non-finite steps (loss and norm are global
  // values, so every rank counts the same and stops at the same step).
  std::int64_t skipped_in_a_row = 0;
  bool diverged = false;
  const double flush_seconds = FaultInjection::from_environment().flush_s;   // 10 s unless a test sets it
  WallTimer flush_timer;
  for (std::int64_t s = start; s < cfg.train.steps; ++s) {
    trace::ProfilerStep profiler_step(s + 1);   // run.trace: HTA's iteration (steps counted from 1)
    auto tokens = host_vector<std::int32_t>(static_cast<std::size_t>(trainer.local_rows() * (T + 1)),
                                            "the training token batch");
    data->sample(static_cast<std::uint64_t>(s), trainer.first_row(), trainer.local_rows(), T, tokens.data(), false);
    watchdog.mark(s, "train step");
    StepResult r = trainer.train_step(tokens, T);
    rt.synchronize();
    pipe.add_step(s);
    if (std::isnan(first_loss)) first_loss = r.loss;
    last_loss = r.loss;
    steps.append({s + 1, r.loss, r.lr, r.grad_norm, r.times.total_ms, r.times.forward_ms, r.times.backward_ms,
                  r.times.comm_ms, r.times.optimizer_ms, tokens_per_step / (r.times.total_ms * 1e-3), r.loss_scale,
                  static_cast<std::int64_t>(r.skipped), static_cast<std::int64_t>(rt.allocator().tracker().current())});
    const bool last = s + 1 == cfg.train.steps;
    const bool log_step = last || s == start || (cfg.train.log_every > 0 && (s + 1) % cfg.train.log_every == 0);
    // The rows reach the disk at every log step and at least every flush_seconds, whatever
    // run.progress says, so that NAME.tmp stays readable after kill -9 (issue 36 item 4).
    if (env.is_root() && (log_step || flush_timer.seconds() >= flush_seconds)) {
      steps.flush();
      flush_timer.reset();
    }
    if (log_step) {
      moe.record(s + 1);
      fp8.record(s + 1);
      const double elapsed = wall.seconds();
      const double per_step = elapsed / static_cast<double>(s + 1 - start);
      const double remaining_s = per_step * static_cast<double>(cfg.train.steps - s - 1);
      const double interval_steps = static_cast<double>(s + 1 - logged_at);
      const StepRates rates = step_rates(interval_steps * tokens_per_step, interval_steps * flops_per_step,
                                         since_log.seconds(), env.world, peak_flops);
      const double memory = static_cast<double>(rt.allocator().tracker().peak());
      since_log.reset();
      logged_at = s + 1;
      if (cfg.run.progress && env.is_root()) {
        fmt::print("step {:>6}/{}  loss {:.4f}  lr {:.2e}  grad_norm {:.3f}  memory {}  tok/s/gpu {:.0f}  TFLOP/s {}  "
                   "MFU {}  {:.1f} ms  ETA {}{}{}\n",
                   s + 1, cfg.train.steps, r.loss, r.lr, r.grad_norm, memory_of_device(memory, device_bytes),
                   rates.tokens_per_s_per_gpu, three_digits(rates.tflops_per_gpu), percent_or_na(rates.mfu),
                   r.times.total_ms, eta(remaining_s), price > 0 ? cost_to_finish(remaining_s, elapsed + remaining_s) : "",
                   r.skipped ? "  (skipped: overflow)" : "");
        std::fflush(stdout);
      }
      if (env.metrics)
        env.metrics->write("train_step", {{"step", s + 1},
                                          {"loss", r.loss},
                                          {"lr", r.lr},
                                          {"grad_norm", r.grad_norm},
                                          {"step_ms", r.times.total_ms},
                                          {"tokens_per_s_per_gpu", rates.tokens_per_s_per_gpu},
                                          {"tflops_per_gpu", rates.tflops_per_gpu},
                                          {"mfu", rates.mfu},
                                          {"memory_bytes", memory},
                                          {"memory_fraction", device_bytes > 0 ? memory / device_bytes : NAN},
                                          {"loss_scale", r.loss_scale},
                                          {"skipped", static_cast<bool>(r.skipped)},
                                          {"elapsed_s", elapsed},
                                          {"eta_s", remaining_s}});
    }
    // The relabelling balances this step's rows (recorded now if this is not a logged step).
    if (rebalancer.due(s + 1) && !last) {
      if (!log_step) moe.record(s + 1);
      watchdog.mark(s + 1, "expert rebalance");
      rebalancer.rebalance(s + 1, moe.last_rows());
    }
    if (cfg.train.eval_every > 0 && ((s + 1) % cfg.train.eval_every == 0 || last)) {
      watchdog.mark(s + 1, "evaluation");
      const double el = evaluate(cfg, trainer, *data);
      evals.append({s + 1, el});
      evals.flush();
      if (env.is_root()) fmt::print("eval  step {:>6}  loss {:.4f}\n", s + 1, el);
      if (env.metrics) env.metrics->write("eval", {{"step", s + 1}, {"loss", el}});
    }
    skipped_in_a_row = r.skipped || !std::isfinite(r.loss) || !std::isfinite(r.grad_norm) ? skipped_in_a_row + 1 : 0;
    if (cfg.train.max_skipped_steps > 0 && skipped_in_a_row >= cfg.train.max_skipped_steps) {
      diverged = true;   // no checkpoint of this state, no final weights
      steps.flush();
      break;
    }
    if (cfg.train.checkpoint_every > 0 && (s + 1) % cfg.train.checkpoint_every == 0 && !last) write_checkpoint();
    if (!last && preemption.agreed_stop(trainer.sync())) {
      interrupted = true;
      break;
    }
  }
  fp8.finish();
  env.out.set_attr("/train", "first_loss", first_loss);
  env.out.set_attr("/train", "final_loss", last_loss);
  env.out.set_attr("/train", "parameters", dims.parameter_count());
  if (dims.moe()) env.out.set_attr("/train", "parameters_active", dims.active_parameter_count());
  for (const auto& [name, value] : data->attributes()) env.out.set_attr("/train", "data_" + name, value);
  const double wall_s = wall.seconds();
  env.out.set_attr("/train", "wall_s", wall_s);
  env.out.set_attr("/train", "gpu_hours", wall_s / 3600.0 * static_cast<double>(env.world));
  if (price > 0) env.out.set_attr("/train", "cost", money(wall_s));
  env.out.set_attr("/train", "interrupted", static_cast<std::int64_t>(interrupted));
  env.out.set_attr("/train", "resumed_at_step", resumed_from.empty() ? std::int64_t{-1} : start);
  env.out.set_attr("/train", "diverged", static_cast<std::int64_t>(diverged));
  if (diverged) {
    env.out.set_attr("/train", "stopped_at_step", trainer.step());
    if (env.is_root())
      fmt::print(stderr,
                 "lmscale: error: training diverged: {} consecutive steps were skipped or had a non-finite loss or "
                 "gradient norm (train.max_skipped_steps = {}); stopped at step {} of {}. The results up to there are "
                 "written to '{}'; {}no checkpoint of this state is written. Lower optim.lr, raise "
                 "optim.warmup_steps or set optim.grad_clip, and resume from an earlier checkpoint.\n",
                 skipped_in_a_row, cfg.train.max_skipped_steps, trainer.step(), cfg.train.steps, cfg.run.output,
                 cfg.train.save.empty() ? "" : fmt::format("the final weights (train.save = '{}') are not saved; ",
                                                           cfg.train.save));
    std::fflush(stderr);
    write_memory_report(env);
    return 1;
  }
  if (!diverged && (cfg.train.checkpoint_every > 0 || sharded_checkpoints) && checkpointed_at != trainer.step())
    write_checkpoint();
  if (interrupted) {
    env.out.set_attr("/train", "stopped_at_step", trainer.step());
    if (env.is_root())
      fmt::print("interrupted (signal {} on rank 0; 0 = another rank's) at step {}: {}; exit {}\n",
                 preemption.signal(), trainer.step(),
                 checkpointed_at != trainer.step()
                     ? std::string("no checkpoint (set train.checkpoint_dir to have one written when a run is stopped)")
                 : sharded_checkpoints
                     ? fmt::format("checkpoint written, resume with train.resume = auto (train.checkpoint_dir = {})",
                                   cfg.train.checkpoint_dir)
                     : fmt::format("checkpoint written, resume with train.resume = {} (the single-file checkpoint "
                                   "train.checkpoint_path)",
                                   cfg.train.checkpoint_path),
                 kExitInterrupted);
    write_memory_report(env);
    return kExitInterrupted;
  }
  if (const auto attrs = data->attributes(); env.is_root() && attrs.count("unigram_entropy"))
    fmt::print("final loss {:.4f} nats/byte vs the text's unigram entropy {:.4f} ({})\n", last_loss,
               attrs.at("unigram_entropy"),
               last_loss < attrs.at("unigram_entropy") ? "below: the model uses the context" : "not below yet");
  if (!cfg.train.save.empty()) {
    watchdog.mark(trainer.step(), "final weights");
    save_weights(env, trainer, cfg.train.save, false);
    if (env.is_root()) fmt::print("weights saved to {}\n", cfg.train.save);
  }
  pipe.write();
  write_memory_report(env);
  return 0;
}

}  // namespace lmscale::jobs
