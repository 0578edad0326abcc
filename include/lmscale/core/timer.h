#pragma once
// Host wall-clock timing and summary statistics of repeated measurements.
#include <chrono>
#include <vector>

namespace lmscale {

class WallTimer {
 public:
  WallTimer() : t0_(std::chrono::steady_clock::now()) {}
  void reset() { t0_ = std::chrono::steady_clock::now(); }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  std::chrono::steady_clock::time_point t0_;
};

struct Stats {
  double mean = 0, std = 0, min = 0, max = 0, median = 0;
  long count = 0;
};
// Population std (as numpy's default); median of the sorted samples.
Stats summarize(std::vector<double> samples);

}  // namespace lmscale
