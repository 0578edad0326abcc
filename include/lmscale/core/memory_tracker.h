#pragma once
// Counts the bytes an allocator hands out: current, peak, peak per phase, and (optionally) a
// timeline of allocation events. Jobs read it to report memory per phase (after init, forward,
// backward, optimizer step) and write the timeline to HDF5 /memory/timeline.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lmscale {

struct MemoryEvent {
  double time_s;            // seconds since the tracker was created
  std::int64_t delta;       // +bytes allocated, -bytes freed
  std::size_t in_use;       // bytes in use after the event
  std::string tag;          // what the bytes are for ("activations", "grads", ...)
};

class MemoryTracker {
 public:
  MemoryTracker();
  void on_alloc(std::size_t bytes, const char* tag);
  void on_free(std::size_t bytes, const char* tag);

  std::size_t current() const { return current_; }
  std::size_t peak() const { return peak_; }
  // Peak since the last mark; closes the phase `name`, records its peak, restarts phase peak.
  std::size_t mark_phase(const std::string& name);
  const std::map<std::string, std::size_t>& phase_peaks() const { return phase_peaks_; }
  std::size_t phase_peak() const { return phase_peak_; }
  void reset_peak() { peak_ = current_; phase_peak_ = current_; }
  // Bytes currently held per tag.
  const std::map<std::string, std::size_t>& by_tag() const { return by_tag_; }

  void record_timeline(bool on) { timeline_on_ = on; }
  const std::vector<MemoryEvent>& timeline() const { return timeline_; }

 private:
  // run.trace: the bytes in use as a counter, sampled (at most one sample per kTraceSampleUs for
  // the whole recorder, carrying the largest value since this tracker's last sample), not one
  // event per allocation.
  static constexpr double kTraceSampleUs = 1000;
  void trace_in_use();
  std::size_t interval_max_ = 0; // largest bytes in use since this tracker's last sample
  std::chrono::steady_clock::time_point t0_;
  std::size_t current_ = 0, peak_ = 0, phase_peak_ = 0;
  std::map<std::string, std::size_t> phase_peaks_;
  std::map<std::string, std::size_t> by_tag_;
  bool timeline_on_ = false;
  std::vector<MemoryEvent> timeline_;
};

}  // namespace lmscale
