#include "lmscale/jobs/engine/pipeline_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lmscale/comm/communicator.h"
#include "lmscale/core/error.h"
#include "lmscale/model/stage.h"
#include "lmscale/parallel/pipeline.h"

namespace lmscale::jobs {

namespace {
constexpr int kEventFields = 6;   // step, micro, phase (0 forward, 1 backward, 2 weight), start_ms, end_ms, chunk
constexpr int kStatFields = 7;    // stage, dp_rank, forward_ms, backward_ms, span_ms (per-step means), peak, events
}  // namespace

PipelineRecorder::PipelineRecorder(JobEnv& env, Trainer& trainer)
    : env_(env), trainer_(trainer), active_(trainer.pipeline() != nullptr) {}

void PipelineRecorder::add_step(std::int64_t step) {
  if (!active_) return;
  const auto& st = trainer_.pipeline()->stats();
  forward_ms_ += st.busy_forward_ms;
  backward_ms_ += st.busy_backward_ms;
  span_ms_ += st.span_ms;
  if (steps_ < kEventSteps)
    for (const auto& e : trainer_.pipeline()->events())
      events_.insert(events_.end(), {static_cast<double>(step + 1), static_cast<double>(e.micro),
                                     e.weight ? 2.0 : e.backward ? 1.0 : 0.0, e.start_ms, e.end_ms, static_cast<double>(e.chunk)});
  ++steps_;
}

double PipelineRecorder::write() {
  if (!active_ || steps_ == 0) return 0;   // (every rank alike: bench forward mode records no steps)
  LMSCALE_CHECK(env_.host_comm, "pipeline report: needs the world's host communicator");
  comm::Communicator& world = *env_.host_comm;
  const int n = world.size();
  const double per = steps_ > 0 ? 1.0 / static_cast<double>(steps_) : 0.0;
  const auto* pipe = trainer_.pipeline();
  const std::vector<double> mine{static_cast<double>(pipe->stage()),
                                 static_cast<double>(trainer_.dp_rank()),
                                 forward_ms_ * per,
                                 backward_ms_ * per,
                                 span_ms_ * per,
                                 static_cast<double>(env_.rt.allocator().tracker().peak()),
                                 static_cast<double>(events_.size() / kEventFields)};
  std::vector<double> stats(static_cast<std::size_t>(n * kStatFields));
  world.all_gather(mine.data(), stats.data(), kStatFields, DType::f64).wait();
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  std::size_t total = 0;
  for (int r = 0; r < n; ++r)
    total += counts[static_cast<std::size_t>(r)] =
        static_cast<std::size_t>(stats[static_cast<std::size_t>(r * kStatFields + 6)]) * kEventFields;
  std::vector<double> events(total);
  world.all_gather_v(events_.data(), events.data(), counts, DType::f64).wait();

  const auto& p = env_.cfg.parallel;
  const int stages = static_cast<int>(p.pp), M = static_cast<int>(p.microbatches);
  const parallel::TheoryBubble theory_of =
      parallel::schedule_theory_bubble(p.schedule, stages, M, static_cast<int>(p.virtual_stages));
  const double theory = theory_of.fraction;
  using C = io::Column;
  auto st = env_.out.create_table("/pipeline/stages", {{"rank", C::Type::i64, ""},
                                                        {"stage", C::Type::i64, ""},
                                                        {"dp_rank", C::Type::i64, ""},
                                                        {"forward_busy_ms", C::Type::f64, "ms"},
                                                        {"backward_busy_ms", C::Type::f64, "ms"},
                                                        {"idle_ms", C::Type::f64, "ms"},
                                                        {"span_ms", C::Type::f64, "ms"},
                                                        {"bubble_fraction", C::Type::f64, ""},
                                                        {"theory_bubble_fraction", C::Type::f64, ""},
                                                        {"peak_bytes", C::Type::i64, "bytes"}});
  double mean_bubble = 0;
  std::vector<io::Row> rows;
  for (int r = 0; r < n; ++r) {
    const double* s = stats.data() + r * kStatFields;
    const double idle = s[4] - s[2] - s[3];
    const double frac = s[4] > 0 ? idle / s[4] : 0;
    mean_bubble += frac / n;
    rows.push_back({static_cast<std::int64_t>(r), static_cast<std::int64_t>(s[0]), static_cast<std::int64_t>(s[1]),
                    s[2], s[3], idle, s[4], frac, theory, static_cast<std::int64_t>(s[5])});
  }
  st.append_rows(rows);
  auto ev = env_.out.create_table("/pipeline/events", {{"rank", C::Type::i64, ""},
                                                        {"stage", C::Type::i64, ""},
                                                        {"step", C::Type::i64, ""},
                                                        {"micro", C::Type::i64, ""},
                                                        {"chunk", C::Type::i64, ""},
                                                        {"phase", C::Type::str, ""},
                                                        {"start_ms", C::Type::f64, "ms"},
                                                        {"end_ms", C::Type::f64, "ms"}});
  rows.clear();
  std::size_t at = 0;
  for (int r = 0; r < n; ++r) {
    const auto stage = static_cast<std::int64_t>(stats[static_cast<std::size_t>(r * kStatFields)]);
    for (std::size_t k = 0; k < counts[static_cast<std::size_t>(r)]; k += kEventFields, at += kEventFields) {
      const double* e = events.data() + at;
      rows.push_back({static_cast<std::int64_t>(r), stage, static_cast<std::int64_t>(e[0]),
                      static_cast<std::int64_t>(e[1]), static_cast<std::int64_t>(e[5]),
                      std::string(e[2] > 1 ? "weight" : e[2] > 0 ? "backward" : "forward"), e[3], e[4]});
    }
  }
  ev.append_rows(rows);
  const std::string g = "/pipeline";
  env_.out.set_attr(g, "schedule", to_string(p.schedule));
  env_.out.set_attr(g, "pp", p.pp);
  env_.out.set_attr(g, "microbatches", p.microbatches);
  env_.out.set_attr(g, "virtual_stages", p.virtual_stages);
  // Blocks per rank (interleaved: summed over its chunks).
  const int V = p.schedule == PipelineSchedule::interleaved ? static_cast<int>(p.virtual_stages) : 1;
  std::vector<int> counts_per_stage;
  for (int s = 0; s < stages; ++s) {
    int blocks = 0;
    for (const auto& u : model::pipeline_chunks(trainer_.dims(), stages, V, s, p.stage_layers))
      blocks += u.end_layer(trainer_.dims()) - u.first_layer();
    counts_per_stage.push_back(blocks);
  }
  env_.out.set_attr(g, "stage_layers", fmt::format("{}", fmt::join(counts_per_stage, ",")));
  env_.out.set_attr(g, "theory_bubble_fraction", theory);
  env_.out.set_attr(g, "measured_bubble_fraction", mean_bubble);
  env_.out.set_attr(g, "steps", steps_);
  if (env_.is_root()) {
    fmt::print("pipeline: {} stages ({} layers), {} microbatches, {}: bubble {:.1f}% measured (mean over ranks), "
               "{:.1f}% theory {}\n",
               stages, fmt::join(counts_per_stage, "/"), M, p.schedule, 100 * mean_bubble, 100 * theory,
               theory_of.formula);
    for (int r = 0; r < n; ++r) {
      const double* s = stats.data() + r * kStatFields;
      fmt::print("  rank {} stage {}: forward {:.2f} ms  backward {:.2f} ms  idle {:.2f} ms of {:.2f} ms  peak {:.3f} GiB\n",
                 r, static_cast<int>(s[0]), s[2], s[3], s[4] - s[2] - s[3], s[4], s[5] / (1024.0 * 1024 * 1024));
    }
  }
  return mean_bubble;
}

}  // namespace lmscale::jobs
