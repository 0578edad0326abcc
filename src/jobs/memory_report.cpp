#include "lmscale/jobs/memory_report.h"

namespace lmscale::jobs {

void write_memory_report(JobEnv& env) {
  const MemoryTracker& t = env.rt.allocator().tracker();
  auto peaks = env.out.create_table("/memory/peaks", {{"phase", io::Column::Type::str, ""},
                                                     {"peak_bytes", io::Column::Type::i64, "bytes"}});
  for (const auto& [phase, bytes] : t.phase_peaks()) peaks.append({phase, static_cast<std::int64_t>(bytes)});
  peaks.append({std::string("overall"), static_cast<std::int64_t>(t.peak())});
  env.out.set_attr("/memory", "device", std::string(device_name(env.rt.device())));
  env.out.set_attr("/memory", "reserved_bytes", static_cast<std::int64_t>(env.rt.allocator().reserved()));
  if (!t.timeline().empty()) {
    auto tl = env.out.create_table("/memory/timeline", {{"time_s", io::Column::Type::f64, "s"},
                                                        {"delta_bytes", io::Column::Type::i64, "bytes"},
                                                        {"in_use_bytes", io::Column::Type::i64, "bytes"},
                                                        {"tag", io::Column::Type::str, ""}});
    for (const auto& e : t.timeline())
      tl.append({e.time_s, e.delta, static_cast<std::int64_t>(e.in_use), e.tag});
  }
}

}  // namespace lmscale::jobs
