#include "lmscale/core/memory_tracker.h"

#include <algorithm>

#include <fmt/format.h>

#include "lmscale/core/trace.h"

namespace lmscale {

MemoryTracker::MemoryTracker() : t0_(std::chrono::steady_clock::now()) {}

// A sample is the bytes in use now ("bytes") and the largest value since this tracker's previous
// sample ("max_bytes"), so the peaks between samples stay visible; the recorder spaces the samples
// of all its allocators (Recorder::take_sample).
void MemoryTracker::trace_in_use() {
  trace::Recorder* r = trace::active();
  if (r == nullptr) return;
  interval_max_ = std::max(interval_max_, current_);
  if (!r->take_sample(r->now_us(), kTraceSampleUs)) return;
  r->counter("memory in use", r->now_us(), fmt::format("\"bytes\":{},\"max_bytes\":{}", current_, interval_max_));
  interval_max_ = current_;
}

void MemoryTracker::on_alloc(std::size_t bytes, const char* tag) {
  current_ += bytes;
  peak_ = std::max(peak_, current_);
  phase_peak_ = std::max(phase_peak_, current_);
  by_tag_[tag ? tag : ""] += bytes;
  trace_in_use();
  if (timeline_on_) {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    timeline_.push_back({t, static_cast<std::int64_t>(bytes), current_, tag ? tag : ""});
  }
}

void MemoryTracker::on_free(std::size_t bytes, const char* tag) {
  current_ -= std::min(bytes, current_);
  auto& b = by_tag_[tag ? tag : ""];
  b -= std::min(bytes, b);
  trace_in_use();
  if (timeline_on_) {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    timeline_.push_back({t, -static_cast<std::int64_t>(bytes), current_, tag ? tag : ""});
  }
}

std::size_t MemoryTracker::mark_phase(const std::string& name) {
  const std::size_t p = phase_peak_;
  auto& slot = phase_peaks_[name];
  slot = std::max(slot, p);
  phase_peak_ = current_;
  return p;
}

}  // namespace lmscale
