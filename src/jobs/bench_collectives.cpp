// Job `bench-collectives` (jobs/bench_collectives.h): nccl-tests-style sweep of one backend's
// collectives, every size checked for exact results.
#include "lmscale/jobs/bench_collectives.h"

#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lmscale/comm/factory.h"
#include "lmscale/comm/mpi_environment.h"
#include "lmscale/comm/nccl_communicator.h"
#include "lmscale/core/error.h"
#include "lmscale/core/tensor.h"
#include "lmscale/core/timer.h"
#include "lmscale/jobs/nccl_tests_report.h"
#ifdef LMSCALE_WITH_CUDA
#include <cuda_runtime.h>

#include "lmscale/core/cuda/cuda_check.h"
#endif

namespace lmscale::jobs {

double busbw_factor(CollectiveOp op, int n) {
  switch (op) {
    case CollectiveOp::all_reduce: return 2.0 * (n - 1) / n;
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_gather:
    // all-to-all: each rank keeps 1/n of its buffer and sends the rest (nccl-tests' alltoall).
    case CollectiveOp::all_to_all: return static_cast<double>(n - 1) / n;
    case CollectiveOp::broadcast: return 1.0;
  }
  throw UsageError(fmt::format("bench.ops: unknown collective '{}' (all-reduce, reduce-scatter, all-gather, broadcast, all-to-all)", op));
}

std::vector<std::int64_t> sweep_sizes(std::int64_t min_bytes, std::int64_t max_bytes, std::int64_t factor) {
  if (min_bytes < 1 || max_bytes < min_bytes || factor < 2)
    throw UsageError(fmt::format("bench.min_bytes={} / bench.max_bytes={} / bench.step_factor={}: need 1 <= min <= max "
                                 "and factor >= 2",
                                 min_bytes, max_bytes, factor));
  std::vector<std::int64_t> sizes;
  for (std::int64_t b = min_bytes; b <= max_bytes; b *= factor) {
    sizes.push_back(b);
    if (b > max_bytes / factor) break;
  }
  return sizes;
}

namespace {

using Encoded = std::array<unsigned char, 8>;   // one element's bytes in its dtype

Encoded encode(DType t, double v) {
  Encoded e{};
  switch (t) {
    case DType::f32: { const float f = static_cast<float>(v); std::memcpy(e.data(), &f, 4); break; }
    case DType::f64: std::memcpy(e.data(), &v, 8); break;
    case DType::bf16: { const bf16_t h = float_to_bf16(static_cast<float>(v)); std::memcpy(e.data(), &h.bits, 2); break; }
    case DType::f16: { const f16_t h = float_to_f16(static_cast<float>(v)); std::memcpy(e.data(), &h.bits, 2); break; }
    case DType::i32: { const auto x = static_cast<std::int32_t>(v); std::memcpy(e.data(), &x, 4); break; }
    case DType::i64: { const auto x = static_cast<std::int64_t>(v); std::memcpy(e.data(), &x, 8); break; }
    default: throw UsageError(fmt::format("bench.dtypes: {} cannot be communicated", dtype_name(t)));
  }
  return e;
}

// Test values: element i of rank r is ((7 i + 3 r) mod 9) - 4, a small integer, so sums over up
// to 64 ranks are exact in every dtype (bf16 included). The value depends on i mod 9 only.
int pattern_index(int rank, std::size_t i) { return static_cast<int>((i % 9 * 7 + static_cast<std::size_t>(rank) * 3) % 9); }
double pattern_value(int rank, std::size_t i) { return pattern_index(rank, i) - 4.0; }

// Where the benchmark's buffers live, and the copies to and from the host that checking needs.
class Space {
 public:
  Space(Device d, std::size_t staging_bytes) : device_(d) {
    if (d == Device::cuda) staging_.resize(staging_bytes);
  }
  Device device() const { return device_; }
  // A host pointer to fill n bytes that end up at dst (flush() copies them there).
  unsigned char* host_for(void* dst) { return device_ == Device::cpu ? static_cast<unsigned char*>(dst) : staging_.data(); }
  void flush(void* dst, std::size_t bytes) {
#ifdef LMSCALE_WITH_CUDA
    if (device_ == Device::cuda) LMSCALE_CUDA_CHECK(cudaMemcpy(dst, staging_.data(), bytes, cudaMemcpyHostToDevice));
#else
    (void)dst, (void)bytes;
#endif
  }
  // Host view of n bytes at src (copied for device memory).
  const unsigned char* fetch(const void* src, std::size_t bytes) {
    if (device_ == Device::cpu) return static_cast<const unsigned char*>(src);
#ifdef LMSCALE_WITH_CUDA
    LMSCALE_CUDA_CHECK(cudaMemcpy(staging_.data(), src, bytes, cudaMemcpyDeviceToHost));
#else
    (void)bytes;
#endif
    return staging_.data();
  }
  void poison(void* dst, std::size_t bytes) {
    if (device_ == Device::cpu) {
      std::memset(dst, 0xff, bytes);
      return;
    }
#ifdef LMSCALE_WITH_CUDA
    LMSCALE_CUDA_CHECK(cudaMemset(dst, 0xff, bytes));
    LMSCALE_CUDA_CHECK(cudaDeviceSynchronize());
#endif
  }

 private:
  Device device_;
  std::vector<unsigned char> staging_;
};

void fill_pattern(Space& space, void* dst, DType t, std::size_t n, int rank) {
  const std::size_t es = dtype_size(t);
  std::array<Encoded, 9> table;
  for (int k = 0; k < 9; ++k) table[static_cast<std::size_t>(k)] = encode(t, k - 4.0);
  unsigned char* h = space.host_for(dst);
  for (std::size_t i = 0, k = static_cast<std::size_t>(pattern_index(rank, 0)); i < n; ++i, k = (k + 7) % 9)
    std::memcpy(h + i * es, table[k].data(), es);
  space.flush(dst, n * es);
}

// Elements of `got` (n elements) that differ from expected(i) (an Encoded).
template <class Expected>
std::int64_t count_wrong(const unsigned char* got, DType t, std::size_t n, Expected&& expected) {
  const std::size_t es = dtype_size(t);
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += std::memcmp(got + i * es, expected(i).data(), es) != 0;
  return wrong;
}

struct Call {
  CollectiveOp op = CollectiveOp::all_reduce;
  DType dtype;
  std::size_t count = 0;   // elements of the whole buffer (bytes / element size)
  std::size_t block = 0;   // reduce-scatter / all-gather / all-to-all: elements per rank
  bool in_place = false;
  const void* send = nullptr;
  void* recv = nullptr;
};

comm::Work launch(comm::Communicator& c, const Call& k, comm::CallOptions o) {
  if (k.op == CollectiveOp::all_reduce) return c.all_reduce(k.send, k.recv, k.count, k.dtype, comm::ReduceOp::sum, o);
  if (k.op == CollectiveOp::reduce_scatter) return c.reduce_scatter(k.send, k.recv, k.block, k.dtype, comm::ReduceOp::sum, o);
  if (k.op == CollectiveOp::all_gather) return c.all_gather(k.send, k.recv, k.block, k.dtype, o);
  if (k.op == CollectiveOp::all_to_all) return c.all_to_all(k.send, k.recv, k.block, k.dtype, o);
  return c.broadcast(k.recv, k.count, k.dtype, 0, o);
}

// One checked call on the test values; returns this rank's wrong elements.
std::int64_t check_call(comm::Communicator& c, Space& space, const Call& k) {
  const int r = c.rank(), p = c.size();
  const std::size_t es = dtype_size(k.dtype);
  if (k.op == CollectiveOp::all_reduce) {
    if (!k.in_place) space.poison(k.recv, k.count * es);
    fill_pattern(space, const_cast<void*>(k.send), k.dtype, k.count, r);
  } else if (k.op == CollectiveOp::reduce_scatter) {
    if (!k.in_place) space.poison(k.recv, k.block * es);
    fill_pattern(space, const_cast<void*>(k.send), k.dtype, k.count, r);
  } else if (k.op == CollectiveOp::all_gather) {
    space.poison(k.recv, k.count * es);
    fill_pattern(space, const_cast<void*>(k.send), k.dtype, k.block, r);
  } else if (k.op == CollectiveOp::all_to_all) {
    space.poison(k.recv, k.count * es);
    fill_pattern(space, const_cast<void*>(k.send), k.dtype, k.count, r);
  } else if (r == 0) {
    fill_pattern(space, k.recv, k.dtype, k.count, 0);
  } else {
    space.poison(k.recv, k.count * es);
  }
  c.set_check(true);
  launch(c, k, {}).synchronize();
  c.set_check(false);

  std::array<Encoded, 9> sums;   // sum over ranks of element i, by i mod 9
  for (std::size_t m = 0; m < 9; ++m) {
    double s = 0;
    for (int q = 0; q < p; ++q) s += pattern_value(q, m);
    sums[m] = encode(k.dtype, s);
  }
  if (k.op == CollectiveOp::all_reduce)
    return count_wrong(space.fetch(k.recv, k.count * es), k.dtype, k.count, [&](std::size_t i) { return sums[i % 9]; });
  if (k.op == CollectiveOp::reduce_scatter) {
    const std::size_t first = static_cast<std::size_t>(r) * k.block;
    return count_wrong(space.fetch(k.recv, k.block * es), k.dtype, k.block,
                       [&](std::size_t i) { return sums[(first + i) % 9]; });
  }
  std::vector<std::array<Encoded, 9>> values(static_cast<std::size_t>(p));
  for (int q = 0; q < p; ++q)
    for (std::size_t m = 0; m < 9; ++m) values[static_cast<std::size_t>(q)][m] = encode(k.dtype, pattern_value(q, m));
  if (k.op == CollectiveOp::all_gather)
    return count_wrong(space.fetch(k.recv, k.count * es), k.dtype, k.count,
                       [&](std::size_t i) { return values[i / k.block][(i % k.block) % 9]; });
  if (k.op == CollectiveOp::all_to_all)   // block q of recv = block r of rank q's send
    return count_wrong(space.fetch(k.recv, k.count * es), k.dtype, k.count, [&](std::size_t i) {
      return values[i / k.block][(static_cast<std::size_t>(r) * k.block + i % k.block) % 9];
    });
  return count_wrong(space.fetch(k.recv, k.count * es), k.dtype, k.count, [&](std::size_t i) { return values[0][i % 9]; });
}

// Seconds per call on this rank: warm-up, barrier, `steps` calls launched back to back.
double time_call(comm::Communicator& c, ops::Runtime& rt, bool device, const Call& k, std::int64_t warmup,
                 std::int64_t steps) {
  const comm::CallOptions async = comm::async_call();
  comm::Work last;
  for (std::int64_t i = 0; i < warmup; ++i) last = launch(c, k, async);
  last.synchronize();
  c.barrier();
  if (device) {
    const auto m0 = rt.mark();
    for (std::int64_t i = 0; i < steps; ++i) last = launch(c, k, async);
    last.wait();   // calls run in order on the communication stream: the last one ends them all
    const auto m1 = rt.mark();
    const double ms = rt.elapsed_ms(m0, m1);
    last.synchronize();
    return ms * 1e-3 / static_cast<double>(steps);
  }
  std::vector<comm::Work> works;
  works.reserve(static_cast<std::size_t>(steps));
  WallTimer timer;
  for (std::int64_t i = 0; i < steps; ++i) works.push_back(launch(c, k, async));
  for (auto& w : works) w.wait();
  return timer.seconds() / static_cast<double>(steps);
}

std::string human_bytes(std::int64_t b) {
  if (b >= (std::int64_t{1} << 30) && b % (std::int64_t{1} << 30) == 0) return fmt::format("{}G", b >> 30);
  if (b >= (std::int64_t{1} << 20) && b % (std::int64_t{1} << 20) == 0) return fmt::format("{}M", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{}K", b >> 10);
  return fmt::format("{}", b);
}

// The path most of the timed calls took (the difference of two path_uses() snapshots); the
// backend's name where it does not report paths (nccl).
std::string dominant_path(const std::vector<comm::PathUse>& before, const std::vector<comm::PathUse>& after,
                          const std::string& backend) {
  std::string best = backend;
  std::uint64_t most = 0;
  for (const auto& a : after) {
    std::uint64_t calls = a.calls;
    for (const auto& b : before)
      if (b.path == a.path) calls -= b.calls;
    if (calls > most) most = calls, best = a.path;
  }
  return best;
}

comm::Algo collective_algo(CollectiveAlgo a) {
  switch (a) {
    case CollectiveAlgo::library: return comm::Algo::library;
    case CollectiveAlgo::ring: return comm::Algo::ring;
    case CollectiveAlgo::shm: return comm::Algo::shm;
    case CollectiveAlgo::hier: return comm::Algo::hier;
    case CollectiveAlgo::automatic: break;
  }
  return comm::Algo::automatic;
}

// nccl-tests' preamble and "# Using devices" lines, gathered to rank 0 in rank order.
void print_nccl_tests_devices(JobEnv& env, const BenchConfig& b, const std::vector<std::int64_t>& sizes) {
  constexpr int kLine = 512;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  int bus = 0;
#ifdef LMSCALE_WITH_CUDA
  if (env.rt.device() == Device::cuda) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, device) != cudaSuccess)
      cudaGetLastError();
  }
#endif
  std::string mine = nccl_tests_rank_line(env.rank, static_cast<int>(::getpid()), host, env.local_rank, bus,
                                          env.rt.device_name());
  mine.resize(kLine, '\0');
  std::vector<char> all(env.rank == 0 ? static_cast<std::size_t>(kLine) * static_cast<std::size_t>(env.world) : 0);
  MPI_Gather(mine.data(), kLine, MPI_CHAR, all.data(), kLine, MPI_CHAR, 0, env.mpi.world());
  if (env.rank != 0) return;
  fmt::print("{}", nccl_tests_preamble(sizes.front(), sizes.back(), b.step_factor, b.warmup, b.steps, b.check));
  for (int q = 0; q < env.world; ++q) fmt::print("{}", std::string(all.data() + static_cast<std::size_t>(q) * kLine));
  fmt::print("#\n");
}

}  // namespace

double time_collective(comm::Communicator& c, ops::Runtime& rt, bool on_device, CollectiveOp op, void* send, void* recv,
                       std::size_t bytes, std::int64_t warmup, std::int64_t steps) {
  Call k;
  k.op = op;
  k.dtype = DType::f32;
  k.count = bytes / 4;
  k.block = k.count / static_cast<std::size_t>(c.size());
  if (op == CollectiveOp::reduce_scatter || op == CollectiveOp::all_gather) k.count = k.block * static_cast<std::size_t>(c.size());
  k.send = send;
  k.recv = recv;
  return time_call(c, rt, on_device, k, warmup, steps);
}

int run_bench_collectives(JobEnv& env) {
  const Config& cfg = env.cfg;
  const BenchConfig& b = cfg.bench;
  // bench-collectives runs before resolve_runtime's backend choice matters: auto is mpi here.
  const comm::Backend kind = cfg.parallel.backend == BackendChoice::nccl ? comm::Backend::nccl : comm::Backend::mpi;
  const std::string backend = comm::backend_name(kind);
  const bool on_device = kind == comm::Backend::nccl;
  const auto sizes = sweep_sizes(b.min_bytes, b.max_bytes, b.step_factor);
  std::vector<DType> dtypes;
  for (FloatType t : b.dtypes) dtypes.push_back(dtype_of(t));
  if (b.steps < 1) throw UsageError("bench.steps must be >= 1");

  auto comm = comm::make_world_communicator(kind, env.mpi, env.local_rank, false,
                                           static_cast<int>(cfg.parallel.comm_sms));   // NCCL CTAs
  comm->set_algo(collective_algo(b.algo));
  if (on_device) comm->set_compute_stream(env.rt.ctx().stream);
  const int p = comm->size(), r = comm->rank();
  const MPI_Comm world = env.mpi.world();

  // Two buffers of the largest size (send and receive), on the GPU for nccl, on the host for mpi.
  const auto max_bytes = static_cast<std::size_t>(sizes.back());
  Allocator& alloc = on_device ? env.rt.allocator() : static_cast<Allocator&>(env.rt.host());
  Tensor send_buf = Tensor::empty({static_cast<std::int64_t>(max_bytes)}, DType::u8, alloc, "bench-collectives send");
  Tensor recv_buf = Tensor::empty({static_cast<std::int64_t>(max_bytes)}, DType::u8, alloc, "bench-collectives recv");
  Space space(on_device ? Device::cuda : Device::cpu, b.check ? max_bytes : 0);
  char* S = static_cast<char*>(send_buf.data());
  char* R = static_cast<char*>(recv_buf.data());

  const std::vector<io::Column> cols = {
      {"op", io::Column::Type::str, ""},           {"backend", io::Column::Type::str, ""},
      {"algo", io::Column::Type::str, ""},         {"path", io::Column::Type::str, ""},
      {"dtype", io::Column::Type::str, ""},
      {"ranks", io::Column::Type::i64, ""},        {"nodes", io::Column::Type::i64, ""},
      {"bytes", io::Column::Type::i64, "bytes"},
      {"count", io::Column::Type::i64, "elements"}, {"inplace", io::Column::Type::i64, "bool"},
      {"time_us_avg", io::Column::Type::f64, "us"}, {"time_us_min", io::Column::Type::f64, "us"},
      {"time_us_max", io::Column::Type::f64, "us"}, {"algbw_gbs", io::Column::Type::f64, "GB/s"},
      {"busbw_gbs", io::Column::Type::f64, "GB/s"}, {"errors", io::Column::Type::i64, "elements"}};
  io::Table table = env.out.create_table("/bench_collectives/results", cols);
  env.out.set_attr("/bench_collectives", "backend", backend);
  env.out.set_attr("/bench_collectives", "algo", to_string(b.algo));
  env.out.set_attr("/bench_collectives", "ranks", static_cast<std::int64_t>(p));
  // Nodes = ranks with node-local rank 0; with the path column it tells a one-node curve from a
  // cross-node one in the analysis tables.
  std::int64_t nodes = env.mpi.local_rank() == 0 ? 1 : 0, lead = nodes;
  MPI_Allreduce(&lead, &nodes, 1, MPI_INT64_T, MPI_SUM, world);
  env.out.set_attr("/bench_collectives", "nodes", nodes);
  env.out.set_attr("/bench_collectives", "warmup", b.warmup);
  env.out.set_attr("/bench_collectives", "steps", b.steps);
  env.out.set_attr("/bench_collectives", "busbw_factors",
                   std::string("nccl-tests: all-reduce 2(n-1)/n, reduce-scatter (n-1)/n, all-gather (n-1)/n, broadcast 1, "
                               "all-to-all (n-1)/n; "
                               "algbw = bytes / avg time; errors = -1 when unchecked"));

  const bool nccl_tests = b.format == BenchFormat::nccl_tests;
  if (r == 0) {
    fmt::print("# bench-collectives: {} ({}), {} ranks on {} node{}, {} warm-up + {} timed calls per size, check {}\n",
               backend, comm->describe(), p, nodes, nodes == 1 ? "" : "s", b.warmup, b.steps, b.check ? "on" : "off");
    fmt::print("# MPI: {}{}\n", env.mpi.library_version(), on_device ? fmt::format("; NCCL {}", comm::nccl_version()) : "");
    if (!nccl_tests) {
      fmt::print("# bytes = whole buffer; algbw = bytes/avg time; busbw = algbw * (all-reduce 2(n-1)/n, "
                 "reduce-scatter/all-gather/all-to-all (n-1)/n, broadcast 1)\n");
      fmt::print("{:<14} {:>5} {:>13} {:>11} {:>7} {:>2} {:>11} {:>11} {:>11} {:>10} {:>10} {:>8} {:<9} {}\n", "op",
                 "type", "size(B)", "count", "size", "ip", "time(us)", "min(us)", "max(us)", "algbw", "busbw", "#wrong",
                 "result", "path");
    }
    std::fflush(stdout);
  }
  if (nccl_tests) print_nccl_tests_devices(env, b, sizes);

  bool failed = false;
  double best_busbw = 0;
  for (const auto& op : b.ops)
    for (DType t : dtypes) {
      // nccl-tests: one table per collective and type, each size measured out of place and in
      // place, closed by its summary lines.
      if (nccl_tests && r == 0) fmt::print("{}", nccl_tests_header());
      double busbw_sum = 0;
      int results = 0, results_with_errors = 0;
      for (std::int64_t size : sizes) {
        const std::size_t es = dtype_size(t);
        Call k;
        k.op = op;
        k.dtype = t;
        k.count = static_cast<std::size_t>(size) / es;
        const bool blocked =
            op == CollectiveOp::reduce_scatter || op == CollectiveOp::all_gather || op == CollectiveOp::all_to_all;
        if (blocked) k.count -= k.count % static_cast<std::size_t>(p);
        if (k.count == 0) continue;
        k.block = blocked ? k.count / static_cast<std::size_t>(p) : k.count;
        // nccl-tests measures both placements; lmscale's broadcast is in place only (the root's
        // buffer is every rank's result), so both its columns show the one in-place measurement.
        // All-to-all has no in-place form (send and recv must not overlap): both columns show the
        // out-of-place one.
        const bool one_placement = op == CollectiveOp::broadcast || op == CollectiveOp::all_to_all;
        std::vector<bool> placements{op == CollectiveOp::broadcast || (b.inplace && op != CollectiveOp::all_to_all)};
        if (nccl_tests && !one_placement) placements = {false, true};
        NcclTestsResult measured[2];
        for (std::size_t pl = 0; pl < placements.size(); ++pl) {
          k.in_place = placements[pl];
          const std::size_t mine = static_cast<std::size_t>(r) * k.block * es;
          if (op == CollectiveOp::all_reduce) {
            k.send = S, k.recv = k.in_place ? S : R;
          } else if (op == CollectiveOp::reduce_scatter) {
            k.send = S, k.recv = k.in_place ? S + mine : R;
          } else if (op == CollectiveOp::all_gather) {
            k.recv = R, k.send = k.in_place ? R + mine : S;
          } else if (op == CollectiveOp::all_to_all) {
            k.send = S, k.recv = R;
          } else {
            k.send = S, k.recv = S;
          }

          std::int64_t wrong = -1;
          if (b.check) {
            const std::int64_t local = check_call(*comm, space, k);
            wrong = 0;
            MPI_Allreduce(&local, &wrong, 1, MPI_INT64_T, MPI_SUM, world);
          }
          const auto before = comm->path_uses();
          const double secs = time_call(*comm, env.rt, on_device, k, b.warmup, b.steps);
          const std::string path = dominant_path(before, comm->path_uses(), backend);
          std::vector<double> all(static_cast<std::size_t>(p));
          MPI_Gather(&secs, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, world);
          double avg = 0, lo = secs, hi = secs;
          if (r == 0) {
            for (double s : all) avg += s / p;
            lo = *std::min_element(all.begin(), all.end());
            hi = *std::max_element(all.begin(), all.end());
          }
          const std::int64_t bytes = static_cast<std::int64_t>(k.count * es);
          const double algbw = avg > 0 ? static_cast<double>(bytes) / avg * 1e-9 : 0;
          const double busbw = algbw * busbw_factor(op, p);
          const bool bad = wrong > 0;
          failed = failed || bad;
          best_busbw = std::max(best_busbw, busbw);
          measured[pl] = {avg * 1e6, algbw, busbw, wrong};
          if (r == 0 && !nccl_tests) {
            fmt::print("{:<14} {:>5} {:>13} {:>11} {:>7} {:>2} {:>11.2f} {:>11.2f} {:>11.2f} {:>10.3f} {:>10.3f} {:>8} {:<9} {}\n",
                       op, dtype_name(t), bytes, k.count, human_bytes(bytes), k.in_place ? 1 : 0, avg * 1e6, lo * 1e6,
                       hi * 1e6, algbw, busbw, wrong, wrong < 0 ? "unchecked" : (bad ? "FAIL" : "ok"), path);
            std::fflush(stdout);
          }
          table.append({to_string(op), backend, to_string(b.algo), path, std::string(dtype_name(t)), static_cast<std::int64_t>(p), nodes, bytes,
                        static_cast<std::int64_t>(k.count), static_cast<std::int64_t>(k.in_place), avg * 1e6, lo * 1e6,
                        hi * 1e6, algbw, busbw, wrong});
          table.flush();
        }
        if (r == 0 && nccl_tests) {
          // The summary averages the busbw of every printed result, both columns (as nccl-tests).
          for (const NcclTestsResult* m : {&measured[0], &measured[placements.size() - 1]}) {
            busbw_sum += m->busbw;
            ++results;
            results_with_errors += m->wrong > 0 ? 1 : 0;
          }
          fmt::print("{}", nccl_tests_row(static_cast<std::int64_t>(k.count * es),
                                          nccl_tests_count(op, static_cast<std::int64_t>(k.count), p), t, op,
                                          measured[0], measured[placements.size() - 1]));
          std::fflush(stdout);
        }
      }
      if (nccl_tests && r == 0) {
        fmt::print("{}", nccl_tests_summary(results_with_errors, results > 0 ? busbw_sum / results : 0.0));
        std::fflush(stdout);
      }
    }
  env.out.set_attr("/bench_collectives", "max_busbw_gbs", best_busbw);
  if (failed && r == 0) fmt::print("# bench-collectives: FAILED: some results were wrong (#wrong > 0)\n");
  return failed ? 1 : 0;
}

}  // namespace lmscale::jobs
