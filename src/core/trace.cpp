#include "lmscale/core/trace.h"
#include "lmscale/core/json_string.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace lmscale::trace {

namespace {
// The documented exception (trace.h): set only by ActiveTrace, read by the hooks.
thread_local Recorder* t_active = nullptr;
}  // namespace

const char* track_name(int track) {
  switch (track) {
    case kHost: return "host";
    case kComm: return "comm";
    case kCommP2P: return "comm p2p";
    case kCudaCompute: return "cuda compute";
    case kMemory: return "memory";
  }
  return "?";
}

Recorder::Recorder() : origin_(std::chrono::steady_clock::now()) {}
Recorder::~Recorder() = default;

void Recorder::reset_origin() {
  std::lock_guard lk(mu_);
  origin_ = std::chrono::steady_clock::now();
  count_ = 0;
  last_sample_us_ = -1;
}

double Recorder::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

namespace {
template <std::size_t N>
void copy_cut(char (&dst)[N], const std::string& src) {
  const std::size_t n = std::min(src.size(), N - 1);
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}
}  // namespace

// Caller holds mu_.
void Recorder::add(const std::string& name, char ph, int tid, double ts, double dur, std::uint64_t id,
                   const std::string& args) {
  if (count_ == chunks_.size() * kChunk) chunks_.emplace_back(new Event[kChunk]);
  Event& e = chunks_[count_ / kChunk][count_ % kChunk];
  ++count_;
  copy_cut(e.name, name);
  copy_cut(e.args, args);
  e.ph = ph, e.tid = tid, e.ts_us = ts, e.dur_us = dur, e.id = id;
}

void Recorder::complete(std::string name, int tid, double ts_us, double dur_us, std::string args) {
  std::lock_guard lk(mu_);
  add(name, 'X', tid, ts_us, dur_us < 0 ? 0 : dur_us, 0, args);
}

void Recorder::counter(std::string name, double ts_us, std::string args) {
  std::lock_guard lk(mu_);
  add(name, 'C', kMemory, ts_us, 0, 0, args);
}

bool Recorder::take_sample(double now_us, double interval_us) {
  std::lock_guard lk(mu_);
  if (last_sample_us_ >= 0 && now_us >= last_sample_us_ && now_us - last_sample_us_ < interval_us) return false;
  last_sample_us_ = now_us;
  return true;
}

void Recorder::async_span(std::string name, int tid, double begin_us, double end_us, std::string args) {
  std::lock_guard lk(mu_);
  const std::uint64_t id = next_id_++;
  add(name, 'b', tid, begin_us, 0, id, args);
  add(name, 'e', tid, end_us < begin_us ? begin_us : end_us, 0, id, {});
}

std::size_t Recorder::size() const {
  std::lock_guard lk(mu_);
  return count_;
}

std::vector<int> Recorder::tracks() const {
  std::lock_guard lk(mu_);
  std::vector<int> out;
  for (std::size_t i = 0; i < count_; ++i) {
    const int tid = chunks_[i / kChunk][i % kChunk].tid;
    if (std::find(out.begin(), out.end(), tid) == out.end()) out.push_back(tid);
  }
  std::sort(out.begin(), out.end());
  return out;
}

ProfilerStep::ProfilerStep(std::int64_t step) : rec_(active()), step_(step) {
  if (rec_) begin_us_ = rec_->now_us();
}

ProfilerStep::~ProfilerStep() {
  if (rec_) rec_->complete(fmt::format("ProfilerStep#{}", step_), kHost, begin_us_, rec_->now_us() - begin_us_);
}

std::string Recorder::serialize(int pid) const {
  std::lock_guard lk(mu_);
  std::string out;
  out.reserve(count_ * 96);
  for (std::size_t i = 0; i < count_; ++i) {
    const Event& e = chunks_[i / kChunk][i % kChunk];
    if (!out.empty()) out += ",\n";
    out += fmt::format(R"({{"name":{},"ph":"{}","pid":{},"tid":{},"ts":{:.3f})", json_string(e.name), e.ph, pid,
                       e.tid, e.ts_us);
    if (e.ph == 'X')
      out += fmt::format(R"(,"dur":{:.3f},"cat":"{}")", e.dur_us,
                         std::strncmp(e.name, "ProfilerStep#", 13) == 0 ? "user_annotation"
                         : e.tid == kCudaCompute                        ? "gpu_user_annotation"
                                                                        : "cpu_op");
    // Async spans: "cat" and "id" pair a begin with its end; Perfetto draws them on their own row.
    if (e.ph == 'b' || e.ph == 'e') out += fmt::format(R"(,"cat":"collective","id":{})", e.id);
    if (e.args[0] != '\0') out += fmt::format(R"(,"args":{{{}}})", e.args);
    out += '}';
  }
  return out;
}

Recorder* active() { return t_active; }

ActiveTrace::ActiveTrace(Recorder* r) : previous_(t_active) { t_active = r; }
ActiveTrace::~ActiveTrace() { t_active = previous_; }



}  // namespace lmscale::trace
