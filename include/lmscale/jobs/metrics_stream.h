#pragma once
// run.metrics: a JSON Lines stream of the run's metrics (docs/metrics.md), for `tail -f`, jq,
// pandas.read_json(lines=True), TensorBoard or W&B. Rank 0 writes it; every line is one JSON
// object, written with one write(2) as soon as it is complete, so a reader never sees half a
// record. The first line is the resolved deck:
//   {"kind": "deck", "job": "train", "world": 2, "lmscale": "0.1.0", "deck": {"run.job": "train", ...}}
// then one object per record, each with its "kind" ("train_step", "eval", "bench_step") and the
// fields its writer gives, e.g.
//   {"kind": "train_step", "step": 10, "loss": 6.93, "lr": 0.0003, ...}
// Non-finite numbers are written as null (JSON has no NaN).
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "lmscale/io/config.h"

namespace lmscale::jobs {

struct MetricsField {
  std::string name;
  std::variant<double, std::int64_t, bool, std::string> value;
};

class MetricsStream {
 public:
  // Inactive (every call a no-op) when `path` is empty or `active` is false (ranks other than 0).
  // Otherwise replaces `path` (an earlier stream or an empty file: deck validation checked it) and
  // writes the deck line. Throws lmscale::Error naming run.metrics when the file cannot be written.
  MetricsStream(const std::string& path, const Config& cfg, int world, bool active);
  ~MetricsStream();
  MetricsStream(const MetricsStream&) = delete;
  MetricsStream& operator=(const MetricsStream&) = delete;

  bool active() const { return fd_ >= 0; }
  // One line: {"kind": kind, then the fields in order}.
  void write(std::string_view kind, const std::vector<MetricsField>& fields);

  // JSON text of one number (null when not finite); strings: lmscale::json_string.
  static std::string json_number(double v);

 private:
  void write_line(const std::string& line);
  std::string path_;
  int fd_ = -1;
};

}  // namespace lmscale::jobs
