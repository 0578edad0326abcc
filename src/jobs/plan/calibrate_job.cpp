// Job `calibrate` (jobs/plan/calibrate_job.h): the planner's rates, measured on this machine.
#include "lmscale/jobs/plan/calibrate_job.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/factory.h"
#include "lmscale/comm/mpi_environment.h"
#include "lmscale/core/error.h"
#include "lmscale/core/tensor.h"
#include "lmscale/jobs/bench_collectives.h"
#include "lmscale/jobs/plan/calibration.h"
#include "lmscale/jobs/plan/collective_model.h"
#include "lmscale/jobs/predict/device_peak.h"
#include "lmscale/ops/host_adamw.h"
#include "lmscale/ops/ops.h"

namespace lmscale::jobs {

namespace {

using plan::Calibration;

// Seconds per call of `work`: one untimed call, then `reps` timed back to back, the device drained
// at both ends (CUDA events on the compute stream on a GPU, the wall clock on a CPU).
template <class Work>
double seconds_per_call(ops::Runtime& rt, int reps, Work&& work) {
  work();
  rt.synchronize();
  const auto m0 = rt.mark();
  for (int i = 0; i < reps; ++i) work();
  const auto m1 = rt.mark();
  rt.synchronize();
  return rt.elapsed_ms(m0, m1) * 1e-3 / reps;
}

Tensor filled(ops::Runtime& rt, Shape shape, DType t, double value, const char* tag) {
  Tensor x = Tensor::empty(shape, t, rt.allocator(), tag);
  ops::fill(rt.ctx(), x, value);
  return x;
}

// n fp32 elements of host memory, every one `value` (written by this thread: first touch).
Tensor filled_host(ops::Runtime& rt, std::int64_t n, float value) {
  Tensor x = Tensor::empty({n}, DType::f32, rt.host(), "calibrate host adamw");
  std::fill(x.data_as<float>(), x.data_as<float>() + n, value);
  return x;
}

}  // namespace

int run_calibrate(JobEnv& env) {
  const Config& cfg = env.cfg;
  ops::Runtime& rt = env.rt;
  const bool cuda = rt.device() == Device::cuda;
  if (env.world < 2 || env.mpi.local_size() != env.world)
    throw UsageError(fmt::format("run.job = calibrate measures the collectives of one node: launch at least 2 ranks, "
                                 "all on one node (mpirun -np 2); {} rank(s) on {} node(s) were launched",
                                 env.world, env.mpi.local_size() == env.world ? 1 : 2));
  // 16-bit GEMMs and attention on a GPU, fp32 on CPUs (the dtypes each device trains in).
  const DType dt = cuda ? DType::bf16 : DType::f32;
  Calibration cal;
  cal.device = rt.device_name();
  cal.source = fmt::format("run.job = calibrate on {} ({} ranks), {}", cal.device, env.world, cfg.command_line);
  const int reps = cuda ? 20 : 3;
  using T = io::Column::Type;

  // GEMMs: square shapes, y[M,N] = x[M,K] w[N,K]^T; FLOPs 2 M N K.
  auto gemm_table = env.out.create_table("/calibrate/gemm", {{"m", T::i64, ""}, {"n", T::i64, ""}, {"k", T::i64, ""},
                                                             {"flops", T::f64, "FLOP"}, {"seconds", T::f64, "s"},
                                                             {"tflops", T::f64, "TFLOP/s"}});
  const std::vector<std::int64_t> sizes = cuda ? std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192}
                                               : std::vector<std::int64_t>{64, 128, 256, 512};
  for (std::int64_t s : sizes) {
    Tensor x = filled(rt, {s, s}, dt, 0.5, "calibrate gemm x"), w = filled(rt, {s, s}, dt, 0.25, "calibrate gemm w");
    Tensor y = Tensor::empty({s, s}, dt, rt.allocator(), "calibrate gemm y");
    const double sec = seconds_per_call(rt, reps, [&] { ops::linear(rt.ctx(), x, w, y); });
    const double flops = 2.0 * static_cast<double>(s * s * s);
    cal.gemm.points.emplace_back(flops, flops / sec);
    gemm_table.append({s, s, s, flops, sec, flops / sec / 1e12});
  }
  const double best_gemm = std::max_element(cal.gemm.points.begin(), cal.gemm.points.end(),
                                            [](auto& a, auto& b) { return a.second < b.second; })->second;
  const double datasheet = device_peak_flops(cal.device, cuda ? PrecisionMode::bf16 : PrecisionMode::fp32, false);
  // Without a datasheet figure (CPUs, unknown GPUs) the fastest measured GEMM stands for the peak.
  cal.peak_flops = datasheet > 0 ? datasheet : best_gemm;

  // Causal flash attention forward + backward, B 1, head dim 64: FLOPs 3.5 x 4 B H T^2 D / 2.
  auto attn_table = env.out.create_table("/calibrate/attention", {{"heads", T::i64, ""}, {"seq", T::i64, ""},
                                                                  {"head_dim", T::i64, ""}, {"flops", T::f64, "FLOP"},
                                                                  {"seconds", T::f64, "s"}, {"tflops", T::f64, "TFLOP/s"}});
  const std::int64_t H = cuda ? 16 : 4, D = 64;
  for (std::int64_t seq : cuda ? std::vector<std::int64_t>{512, 2048, 8192} : std::vector<std::int64_t>{64, 128, 256}) {
    const auto shape = ops::AttentionShape::bhtd(1, H, seq, D, true);
    Tensor q = filled(rt, {1, H, seq, D}, dt, 0.1, "calibrate q"), k = filled(rt, {1, H, seq, D}, dt, 0.2, "calibrate k"),
           v = filled(rt, {1, H, seq, D}, dt, 0.3, "calibrate v"), o = filled(rt, {1, H, seq, D}, dt, 0, "calibrate o");
    Tensor dout = filled(rt, {1, H, seq, D}, dt, 0.01, "calibrate do"), dq = filled(rt, {1, H, seq, D}, dt, 0, "dq"),
           dk = filled(rt, {1, H, seq, D}, dt, 0, "dk"), dv = filled(rt, {1, H, seq, D}, dt, 0, "dv");
    Tensor lse = filled(rt, {1, H, seq}, DType::f32, 0, "calibrate lse");
    const double sec = seconds_per_call(rt, reps, [&] {
      ops::attention_flash(rt.ctx(), shape, q, k, v, o, lse);
      ops::attention_flash_backward(rt.ctx(), shape, q, k, v, o, lse, dout, dq, dk, dv);
    });
    const double flops = 3.5 * 4.0 * static_cast<double>(H * seq * seq * D) / 2;
    cal.attention.points.emplace_back(flops, flops / sec);
    attn_table.append({H, seq, D, flops, sec, flops / sec / 1e12});
  }

  // Memory-bound work: an elementwise add (two reads, one write), AdamW (fp32 p, g, m, v read,
  // p, m, v written: 28 B per parameter) and the launch gap of a one-element fill.
  auto bw_table = env.out.create_table("/calibrate/bandwidth", {{"kind", T::str, ""}, {"bytes", T::f64, "bytes"},
                                                                {"seconds", T::f64, "s"}, {"gbs", T::f64, "GB/s"}});
  const std::int64_t n = cuda ? (std::int64_t{1} << 27) : (std::int64_t{1} << 22);
  {
    Tensor a = filled(rt, {n}, dt, 1, "calibrate a"), b = filled(rt, {n}, dt, 2, "calibrate b");
    Tensor c = Tensor::empty({n}, dt, rt.allocator(), "calibrate c");
    const double bytes = 3.0 * static_cast<double>(n) * static_cast<double>(dtype_size(dt));
    const double sec = seconds_per_call(rt, reps, [&] { ops::add(rt.ctx(), a, b, c); });
    cal.elementwise_bytes_per_s = bytes / sec;
    bw_table.append({std::string("elementwise add"), bytes, sec, bytes / sec / 1e9});
  }
  {
    Tensor p = filled(rt, {n}, DType::f32, 1, "calibrate p"), g = filled(rt, {n}, DType::f32, 1e-3, "calibrate g");
    Tensor m = filled(rt, {n}, DType::f32, 0, "calibrate m"), v = filled(rt, {n}, DType::f32, 0, "calibrate v");
    const double bytes = 28.0 * static_cast<double>(n);
    ops::AdamWStep step;
    const double sec = seconds_per_call(rt, reps, [&] { ops::adamw(rt.ctx(), p, g, m, v, step, nullptr); });
    cal.optimizer_bytes_per_s = bytes / sec;
    bw_table.append({std::string("adamw"), bytes, sec, bytes / sec / 1e9});
  }
  {
    // The host AdamW of parallel.offload (ops/host_adamw.h) with every hardware thread: the rate
    // the node's ranks share. 2^24 elements (0.5 GB of traffic), past the caches; best of 3.
    const std::int64_t hn = std::int64_t{1} << 24;
    Tensor p = filled_host(rt, hn, 1), g = filled_host(rt, hn, 1e-3), m = filled_host(rt, hn, 0), v = filled_host(rt, hn, 0);
    Tensor low = Tensor::empty({hn}, DType::bf16, rt.host(), "calibrate host adamw");
    const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      ops::AdamWStep step;
      step.step = r + 1;
      const auto t0 = std::chrono::steady_clock::now();
      ops::adamw_host(p, g, m, v, step, &low, ops::AdamWArithmetic::cuda_kernel, threads);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double bytes = cal.host_adamw_bytes_per_param * static_cast<double>(hn);
    cal.host_adamw_bytes_per_s = bytes / best;
    bw_table.append({std::string("host adamw (parallel.offload)"), bytes, best, bytes / best / 1e9});
  }
  {
    Tensor one = Tensor::empty({1}, DType::f32, rt.allocator(), "calibrate launch");
    const double sec = seconds_per_call(rt, 200, [&] { ops::fill(rt.ctx(), one, 1.0); });
    cal.launch_gap_s = sec;
    bw_table.append({std::string("launch (one-element fill)"), 4.0, sec, 4.0 / sec / 1e9});
  }
  // The device's memory bandwidth the rates stand against: the datasheet's for H100 and H200 (the
  // cluster presets' figures), else the measured elementwise rate.
  const bool h200 = cal.device.find("H200") != std::string::npos, h100 = cal.device.find("H100") != std::string::npos;
  cal.hbm_bytes_per_s = h200 ? 4.8e12 : h100 ? 3.35e12 : cal.elementwise_bytes_per_s;

  // Collectives: fp32 all-reduce over the launched ranks (one node) with the bench-collectives
  // timing at the bench.* sizes, max over ranks; alpha and beta of a ring fitted to them.
  const comm::Backend backend = cfg.parallel.backend == BackendChoice::nccl || (cuda && cfg.parallel.backend != BackendChoice::mpi)
                                    ? comm::Backend::nccl : comm::Backend::mpi;
  auto comm = comm::make_world_communicator(backend, env.mpi, env.local_rank);
  const bool on_device = backend == comm::Backend::nccl;
  if (on_device) comm->set_compute_stream(rt.ctx().stream);
  const auto coll_sizes = sweep_sizes(cfg.bench.min_bytes, cfg.bench.max_bytes, cfg.bench.step_factor);
  Allocator& alloc = on_device ? rt.allocator() : static_cast<Allocator&>(rt.host());
  Tensor send = Tensor::empty({coll_sizes.back() / 4 + 1}, DType::f32, alloc, "calibrate send");
  Tensor recv = Tensor::empty({coll_sizes.back() / 4 + 1}, DType::f32, alloc, "calibrate recv");
  std::vector<std::pair<double, double>> points;
  // Per size the fastest of kRounds timings (each the slowest rank's mean over bench.steps calls):
  // a rank the OS deschedules in one round (a shared or loaded host) does not bend the fit.
  constexpr int kRounds = 5;
  for (std::int64_t bytes : coll_sizes) {
    double best = 1e30;
    for (int r = 0; r < kRounds; ++r) {
      double sec = time_collective(*comm, rt, on_device, CollectiveOp::all_reduce, send.data(), recv.data(),
                                   static_cast<std::size_t>(bytes), cfg.bench.warmup, cfg.bench.steps);
      MPI_Allreduce(MPI_IN_PLACE, &sec, 1, MPI_DOUBLE, MPI_MAX, env.mpi.world());
      best = std::min(best, sec);
    }
    points.emplace_back(static_cast<double>(bytes / 4 * 4), best);
  }
  const plan::Link link = plan::fit_ring_link(CollectiveOp::all_reduce, env.world, points);
  cal.intra_alpha_s = link.alpha_s;
  cal.intra_bus_bytes_per_s = link.bus_bytes_per_s;
  cal.intra_ranks = env.world;
  auto coll_table = env.out.create_table("/calibrate/collectives", {{"op", T::str, ""}, {"ranks", T::i64, ""},
                                                                    {"bytes", T::f64, "bytes"},
                                                                    {"measured_s", T::f64, "s"},
                                                                    {"model_s", T::f64, "s"},
                                                                    {"relative_error", T::f64, ""}});
  for (const auto& [bytes, sec] : points) {
    const double model = plan::ring_time(CollectiveOp::all_reduce, env.world, bytes, link);
    coll_table.append({std::string("all-reduce"), static_cast<std::int64_t>(env.world), bytes, sec, model,
                       (model - sec) / sec});
  }
  // Contention is not measured here: the shipped H200 fit (inputs/calibration/h200.ini) stands.
  cal.nccl_contention = 0.6;
  cal.copy_engine_contention = 0.3;
  cal.source += "; overlap contention not measured (the shipped H200 fit)";
  env.out.set_attr("/calibrate", "device", cal.device);
  env.out.set_attr("/calibrate", "output", cfg.calibrate.output);
  env.out.set_attr("/calibrate", "intra_alpha_us", cal.intra_alpha_s * 1e6);
  env.out.set_attr("/calibrate", "intra_busbw_gbs", cal.intra_bus_bytes_per_s / 1e9);
  if (!env.is_root()) return 0;
  // The calibration file: written next to its place and renamed, so a reader never sees half of it.
  const std::string text = plan::calibration_text(cal), tmp = cfg.calibrate.output + ".tmp";
  const auto dir = std::filesystem::path(cfg.calibrate.output).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  {
    std::ofstream f(tmp);
    f << text;
    if (!f) throw Error(fmt::format("calibrate.output: cannot write '{}'", tmp));
  }
  std::filesystem::rename(tmp, cfg.calibrate.output);
  fmt::print("calibration of {} ({} ranks):\n{}written to {}\n", cal.device, env.world, text, cfg.calibrate.output);
  return 0;
}

}  // namespace lmscale::jobs
