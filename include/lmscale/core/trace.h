#pragma once
// Chrome-trace recording (run.trace, docs/profiling.md): complete events ("X") for the NVTX ranges,
// collectives and waits, async spans from a collective's issue to its completion, and counter
// events ("C") for the allocator's bytes in use. One Recorder per rank, owned by the run (app/);
// every rank writes its own events to its own JSON file (jobs/trace_output.h).
//
// The NvtxRange call sites (model, parallel, jobs) and the allocator cannot be handed an object
// without threading it through every signature, so the run installs its recorder as the
// *thread-local* active recorder (ActiveTrace) for the duration of the job: a documented exception
// to "no global mutable state". With no recorder installed (run.trace empty) every hook is one
// thread-local load and a branch.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace lmscale::trace {

// Tracks (Chrome "tid") of one rank (Chrome "pid" = rank). Names: track_name().
enum Track : int {
  kHost = 0,         // the rank's main thread: steps, phases, layers, attention sub-ranges, waits
  kComm = 1,         // collectives as run by the communication thread (mpi) or comm stream (nccl)
  kCommP2P = 2,      // point-to-point send/recv (pipeline), which may be in flight together
  kCudaCompute = 3,  // the NVTX ranges as timed by CUDA events on the compute stream
  kMemory = 4,       // allocator counters
};
const char* track_name(int track);

// Fixed-size, so recording allocates nothing per event (see Recorder::chunks_); longer names or
// args are cut (lmscale's are far shorter).
struct Event {
  char name[48];
  char args[112];        // a JSON object's members without braces ("\"bytes\":4096"), may be empty
  char ph;               // 'X' complete, 'C' counter, 'b'/'e' async begin/end
  int tid;
  double ts_us;          // microseconds since the recorder's origin
  double dur_us;         // 'X' only
  std::uint64_t id;      // 'b'/'e' only
};

class Recorder;

// GPU side of a trace (CUDA builds: core/cuda/trace_timeline.cpp): CUDA events recorded on a
// stream at a range's begin and end, resolved into complete events later, without a host sync
// inside a step (finished ranges are resolved when many are pending, the rest at the end).
class DeviceTimeline {
 public:
  virtual ~DeviceTimeline() = default;
  // Records a begin event on `stream` (nullptr: the compute stream); returns its token.
  virtual int begin(void* stream) = 0;
  // Records the end event on `stream`; the range becomes an event named `name` on track `tid`.
  virtual void end(void* stream, int token, std::string name, int tid, std::string args) = 0;
  // Moves resolved ranges into `rec`; `wait`: every pending one (blocks until the GPU is done).
  virtual void flush(Recorder& rec, bool wait) = 0;
};

// A timeline on `compute_stream` (cudaStream_t) whose clock is aligned with `rec` now; defined only
// in CUDA builds.
std::unique_ptr<DeviceTimeline> make_cuda_timeline(Recorder& rec, void* compute_stream);

class Recorder {
 public:
  Recorder();
  ~Recorder();
  // Restarts the clock: called right after a barrier so every rank's 0 is (nearly) the same instant.
  void reset_origin();
  double now_us() const;

  // Thread-safe: the communication thread records too.
  void complete(std::string name, int tid, double ts_us, double dur_us, std::string args = {});
  void counter(std::string name, double ts_us, std::string args);
  // Counter sampling, shared by every writer of this recorder (allocators): true, and the sample
  // time advanced to `now_us`, when at least `interval_us` passed since the last sample.
  bool take_sample(double now_us, double interval_us);
  void async_span(std::string name, int tid, double begin_us, double end_us, std::string args = {});

  // CUDA: also time ranges on the GPU (kCudaCompute); the recorder owns the timeline.
  void set_device_timeline(std::unique_ptr<DeviceTimeline> t) { device_ = std::move(t); }
  // -1 without a device timeline.
  int device_begin(void* stream = nullptr) { return device_ ? device_->begin(stream) : -1; }
  void device_end(int token, std::string name, int tid = kCudaCompute, std::string args = {}, void* stream = nullptr) {
    if (device_ && token >= 0) device_->end(stream, token, std::move(name), tid, std::move(args));
  }
  // At the end of the job: resolves every pending GPU range (waits for the GPU).
  void finish_device() {
    if (device_) device_->flush(*this, true);
  }

  std::size_t size() const;
  // The tracks (tids) that hold at least one event, ascending.
  std::vector<int> tracks() const;
  // Every event as Chrome-trace JSON objects separated by ",\n", with pid = `pid`. Complete
  // events carry the category HTA and the PyTorch profiler use: "user_annotation" for
  // ProfilerStep#N, "gpu_user_annotation" on the cuda compute track, "cpu_op" elsewhere.
  std::string serialize(int pid) const;

 private:
  void add(const std::string& name, char ph, int tid, double ts, double dur, std::uint64_t id, const std::string& args);
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mu_;
  // Events live in chunks allocated once and kept until the end: heap allocations per event
  // (strings, a growing vector) interleaved with the model's buffers made those page-fault ~2.5x
  // as often (measured: +10% step time on a CPU bench-model).
  static constexpr std::size_t kChunk = 4096;
  std::vector<std::unique_ptr<Event[]>> chunks_;
  std::size_t count_ = 0;
  std::uint64_t next_id_ = 1;
  double last_sample_us_ = -1;   // take_sample's last sample; -1: none yet
  std::unique_ptr<DeviceTimeline> device_;
};

// The active recorder of the calling thread, or nullptr.
Recorder* active();

// A "ProfilerStep#N" span on the host track around one training or bench step, as the PyTorch
// profiler's step annotation: HTA splits a trace into iterations by these. Records nothing
// without an active recorder.
class ProfilerStep {
 public:
  explicit ProfilerStep(std::int64_t step);
  ~ProfilerStep();
  ProfilerStep(const ProfilerStep&) = delete;
  ProfilerStep& operator=(const ProfilerStep&) = delete;

 private:
  Recorder* rec_;
  std::int64_t step_;
  double begin_us_ = 0;
};

// Installs `r` (may be null) as the calling thread's active recorder; restores the previous one.
class ActiveTrace {
 public:
  explicit ActiveTrace(Recorder* r);
  ~ActiveTrace();
  ActiveTrace(const ActiveTrace&) = delete;
  ActiveTrace& operator=(const ActiveTrace&) = delete;

 private:
  Recorder* previous_;
};

}  // namespace lmscale::trace
