// Job `plan` (jobs/plan/plan_job.h): the deck's layout and the ranked layout search on a cluster.
#include "lmscale/jobs/plan/plan_job.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/io/results.h"
#include "lmscale/jobs/plan/cluster.h"
#include "lmscale/jobs/plan/layout_search.h"

namespace lmscale::jobs {

namespace {

using plan::Candidate;
constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

std::vector<io::Column> layout_columns() {
  using T = io::Column::Type;
  return {{"rank", T::i64, ""},          {"layout", T::str, ""},          {"family", T::str, ""},
          {"dp", T::i64, ""},            {"tp", T::i64, ""},              {"pp", T::i64, ""},
          {"zero", T::str, ""},          {"checkpointing", T::str, ""},   {"microbatches", T::i64, ""},
          {"sequence_parallel", T::i64, "bool"}, {"memory_bytes", T::f64, "bytes"}, {"fits", T::i64, "bool"},
          {"step_ms", T::f64, "ms"},     {"tokens_per_s_per_gpu", T::f64, "tokens/s"}, {"mfu", T::f64, ""},
          {"compute_ms", T::f64, "ms"},  {"exposed_comm_ms", T::f64, "ms"}, {"contention_ms", T::f64, "ms"},
          {"bubble_ms", T::f64, "ms"},   {"optimizer_ms", T::f64, "ms"},  {"deck", T::i64, "bool"}};
}

void append_layout(io::Table& t, std::int64_t rank, const Candidate& k) {
  const auto& s = k.step;
  t.append({rank, k.layout, k.family, static_cast<std::int64_t>(k.dp), static_cast<std::int64_t>(k.tp),
            static_cast<std::int64_t>(k.pp), to_string(k.cfg.parallel.zero), to_string(k.cfg.train.activation_checkpointing),
            s.microbatches, static_cast<std::int64_t>(k.cfg.parallel.sequence_parallel), k.memory_bytes,
            static_cast<std::int64_t>(k.fits), s.step_s * 1e3, s.tokens_per_s_per_gpu, s.mfu, s.compute_s * 1e3,
            s.exposed_comm_s * 1e3, s.contention_s * 1e3, s.bubble_s * 1e3, s.optimizer_s * 1e3,
            static_cast<std::int64_t>(k.deck)});
}

// The breakdown of one layout: compute per op and communication per collective.
void write_breakdown(JobEnv& env, const std::string& group, const Candidate& k) {
  using T = io::Column::Type;
  auto ops = env.out.create_table(group + "/compute", {{"op", T::str, ""},
                                                       {"flops", T::f64, "FLOP"},
                                                       {"bytes", T::f64, "bytes"},
                                                       {"ms", T::f64, "ms"}});
  for (const auto& o : k.step.compute) ops.append({o.op, o.flops, o.bytes, o.seconds * 1e3});
  auto comm = env.out.create_table(group + "/comm", {{"collective", T::str, ""},  {"axis", T::str, ""},
                                                     {"purpose", T::str, ""},     {"algorithm", T::str, ""},
                                                     {"inter_node", T::i64, "bool"}, {"calls", T::f64, ""},
                                                     {"bytes_per_call", T::f64, "bytes"}, {"ms", T::f64, "ms"},
                                                     {"exposed_ms", T::f64, "ms"}, {"contention_ms", T::f64, "ms"}});
  for (const auto& c : k.step.comm)
    comm.append({c.collective, c.axis, c.purpose, c.algorithm, static_cast<std::int64_t>(c.inter_node), c.calls,
                 c.bytes_per_call, c.seconds * 1e3, c.exposed_s * 1e3, c.contention_s * 1e3});
  env.out.set_attr(group, "layout", k.layout);
  env.out.set_attr(group, "step_ms", k.step.step_s * 1e3);
  env.out.set_attr(group, "bubble_ms", k.step.bubble_s * 1e3);
  env.out.set_attr(group, "overlapped_comm_ms", k.step.overlapped_comm_s * 1e3);
}

void print_breakdown(const Candidate& k) {
  const auto& s = k.step;
  fmt::print("  step {:.2f} ms = compute {:.2f} + optimizer {:.2f} + exposed communication {:.2f} + contention {:.2f} "
             "+ bubble {:.2f}\n",
             s.step_s * 1e3, s.compute_s * 1e3, s.optimizer_s * 1e3, s.exposed_comm_s * 1e3, s.contention_s * 1e3,
             s.bubble_s * 1e3);
  for (const auto& o : s.compute)
    fmt::print("    {:<22} {:>10.2f} ms{}\n", o.op, o.seconds * 1e3,
               o.flops > 0 ? fmt::format("  {:.0f} TFLOP/s", o.flops / o.seconds / 1e12)
                           : fmt::format("  {:.0f} GB/s", o.bytes / o.seconds / 1e9));
  for (const auto& c : s.comm)
    fmt::print("    {:<14} {:<3} {:>8.0f} x {:>10.3g} B {:<5} {:<5} {:>9.2f} ms, exposed {:.2f} ms  ({})\n", c.collective,
               c.axis, c.calls, c.bytes_per_call, c.algorithm, c.inter_node ? "inter" : "intra", c.seconds * 1e3,
               c.exposed_s * 1e3, c.purpose);
}

// plan.gpus, or the deck's layout size.
// plan.gpus, or the deck's layout size (parallel.dp is resolved against it by the deck parser).
int planned_gpus(const Config& cfg) { return static_cast<int>(cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp); }

}  // namespace

int run_plan(JobEnv& env) {
  const Config& cfg = env.cfg;
  const std::string cal_path =
      cfg.plan.calibration.empty() ? plan::default_calibration_path(cfg.plan.cluster) : cfg.plan.calibration;
  const plan::Calibration cal = plan::read_calibration(cal_path);   // UsageError before any output
  if (cfg.parallel.offload != OffloadMode::none && !(cal.host_adamw_bytes_per_s > 0))
    throw UsageError(fmt::format("parallel.offload = {}: the calibration '{}' has no [host] adamw_gbs (the host "
                                 "AdamW's rate); add it, run run.job = calibrate on the cluster's node, or set "
                                 "parallel.offload = none",
                                 cfg.parallel.offload, cal_path));
  const plan::Cluster cluster = plan::resolve_cluster(cfg, cal);
  const int gpus = planned_gpus(cfg);
  const std::int64_t batch = cfg.plan.batch_size > 0 ? cfg.plan.batch_size : cfg.train.batch_size;
  const Config deck = plan::deck_layout(cfg, batch, gpus);
  const std::string refused = plan::layout_refusal(deck, gpus);
  if (!refused.empty())
    throw UsageError(fmt::format("the deck's layout on plan.gpus = {} cannot run: {}", gpus, refused));
  Candidate mine = plan::evaluate_layout(deck, batch, gpus, cluster, cal);
  mine.deck = true;
  std::vector<Candidate> layouts;
  if (cfg.plan.search) layouts = plan::search_layouts(cfg, batch, gpus, cluster, cal);
  plan::rank_layouts(layouts);

  const std::string g = "/plan";
  env.out.set_attr(g, "gpus", static_cast<std::int64_t>(gpus));
  env.out.set_attr(g, "batch_sequences", batch);
  env.out.set_attr(g, "cluster", cluster.name);
  env.out.set_attr(g, "cluster_sources", cluster.sources);
  env.out.set_attr(g, "gpus_per_node", static_cast<std::int64_t>(cluster.gpus_per_node));
  env.out.set_attr(g, "peak_flops_per_gpu", cluster.bf16_flops);
  env.out.set_attr(g, "memory_bytes_per_gpu", cluster.memory_bytes);
  env.out.set_attr(g, "calibration", cal_path);
  env.out.set_attr(g, "calibration_device", cal.device);
  env.out.set_attr(g, "calibration_source", cal.source);
  auto table = env.out.create_table("/plan/layouts", layout_columns());
  append_layout(table, 0, mine);
  for (std::size_t i = 0; i < layouts.size(); ++i) append_layout(table, static_cast<std::int64_t>(i + 1), layouts[i]);
  write_breakdown(env, "/plan/deck", mine);
  if (!layouts.empty()) write_breakdown(env, "/plan/best", layouts.front());

  // The sweep: per family, the best fitting layout at 1, 2, 4, ... GPUs, at the deck's batch per GPU.
  if (cfg.plan.sweep_max_gpus > 0) {
    using T = io::Column::Type;
    auto sweep = env.out.create_table("/plan/sweep", {{"gpus", T::i64, ""},
                                                      {"family", T::str, ""},
                                                      {"layout", T::str, ""},
                                                      {"batch_sequences", T::i64, ""},
                                                      {"step_ms", T::f64, "ms"},
                                                      {"tokens_per_s_per_gpu", T::f64, "tokens/s"},
                                                      {"mfu", T::f64, ""},
                                                      {"memory_bytes", T::f64, "bytes"}});
    const double per_gpu = static_cast<double>(batch) / gpus;
    const plan::SearchSpace narrow{false, false, false, 16};
    for (std::int64_t n = 1; n <= cfg.plan.sweep_max_gpus; n *= 2) {
      const auto b = std::max<std::int64_t>(1, std::llround(per_gpu * static_cast<double>(n)));
      std::vector<Candidate> all = plan::search_layouts(cfg, b, static_cast<int>(n), cluster, cal, narrow);
      plan::rank_layouts(all);
      std::vector<std::string> done;
      for (const Candidate& k : all) {
        if (!k.fits || std::find(done.begin(), done.end(), k.family) != done.end()) continue;
        done.push_back(k.family);
        sweep.append({n, k.family, k.layout, b, k.step.step_s * 1e3, k.step.tokens_per_s_per_gpu, k.step.mfu,
                      k.memory_bytes});
      }
    }
  }
  if (!env.is_root()) return 0;
  fmt::print("plan: {} GPUs of {} ({} per node; {:.0f} TFLOP/s, {:.0f} GB/s HBM, {:.2f} GiB), global batch {} x {} "
             "tokens\ncalibration {} ({})\n",
             gpus, cluster.name, cluster.gpus_per_node, cluster.bf16_flops / 1e12, cluster.hbm_bytes_per_s / 1e9,
             cluster.memory_bytes / GiB, batch, cfg.model.context_length, cal_path, cal.device);
  auto line = [&](const std::string& tag, const Candidate& k) {
    fmt::print("{:<6} {:>9.2f} ms {:>10.0f} tok/s/GPU  MFU {:>5.1f}%  {:>7.2f} GiB{}  {}\n", tag, k.step.step_s * 1e3,
               k.step.tokens_per_s_per_gpu, 100 * k.step.mfu, k.memory_bytes / GiB, k.fits ? "" : " (does NOT fit)",
               k.layout);
  };
  line("deck", mine);
  print_breakdown(mine);
  if (!layouts.empty()) {
    fmt::print("{} layouts searched, best first (all in /plan/layouts):\n", layouts.size());
    for (std::size_t i = 0; i < layouts.size() && i < static_cast<std::size_t>(cfg.plan.top); ++i)
      line(fmt::format("#{}", i + 1), layouts[i]);
    fmt::print("best layout:\n");
    print_breakdown(layouts.front());
  }
  return 0;
}

}  // namespace lmscale::jobs
