// lmscale: reads a deck, sets up MPI, the device and the results file, runs one job.
// Exit codes: 0 ok, 1 runtime failure, 2 bad usage or deck (nothing run, nothing written), 75 train
// stopped by SIGTERM/SIGUSR1 after writing a checkpoint (jobs/resilience/preemption.h, docs/checkpoints.md).
// A failure before the first result row leaves no file; after it, NAME.tmp keeps the rows and the
// error names it (io/results.h).
#include <csignal>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "lmscale/comm/factory.h"
#include "lmscale/comm/mpi_environment.h"
#include "lmscale/core/error.h"
#include "lmscale/core/trace.h"
#include "lmscale/io/deck.h"
#include "lmscale/io/hdf5_library.h"
#include "lmscale/io/output_lock.h"
#include "lmscale/io/results.h"
#include "lmscale/io/trace_file.h"
#include "lmscale/jobs/trace_output.h"
#include "lmscale/jobs/dispatch.h"
#include "lmscale/jobs/job_env.h"
#include "lmscale/jobs/metrics_stream.h"
#include "lmscale/jobs/predict/memory_fit.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/version.h"
#include "system_info.h"

namespace {

// Runs `check` on every rank. When it throws UsageError on any rank, every rank throws the message
// of the lowest such rank as AgreedUsageError, so that all exit 2 together (none is left waiting
// in a collective).
void agree_on_usage(lmscale::comm::MpiEnvironment& mpi, const std::function<void()>& check) {
  std::string message;
  try {
    check();
  } catch (const lmscale::UsageError& e) {
    message = e.what();
  }
  if (mpi.size() == 1) {
    if (!message.empty()) throw lmscale::UsageError(message);
    return;
  }
  int mine = message.empty() ? mpi.size() : mpi.rank(), first = mpi.size();
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, mpi.world());
  if (first == mpi.size()) return;
  int length = static_cast<int>(message.size());
  MPI_Bcast(&length, 1, MPI_INT, first, mpi.world());
  message.resize(static_cast<std::size_t>(length));
  MPI_Bcast(message.data(), length, MPI_CHAR, first, mpi.world());
  throw lmscale::AgreedUsageError(first == 0 ? message : fmt::format("rank {}: {}", first, message));
}

// `partial`: set when the run fails after results were written, to the sentence naming the kept
// NAME.tmp.
int run(lmscale::comm::MpiEnvironment& mpi, int argc, char** argv, std::string& partial) {
  using namespace lmscale;
  const bool root = mpi.rank() == 0;
  // The deck's checks read files that can differ between nodes (token files, output and checkpoint
  // directories): a failure on one rank only must end every rank with exit 2 and its message,
  // rather than leave the others waiting in the first collective (issue 36).
  io::Invocation inv;
  agree_on_usage(mpi, [&] { inv = io::parse_invocation(argc, argv, mpi.size()); });
  switch (inv.action) {
    case io::Invocation::Action::help:
      if (root) std::fputs(io::help_text().c_str(), stdout);
      return 0;
    case io::Invocation::Action::help_markdown:
      if (root) std::fputs(io::deck_markdown().c_str(), stdout);
      return 0;
    case io::Invocation::Action::version:
      if (root) fmt::print("lmscale {} (git {}, CUDA {})\n", kVersion, kGitCommit, kWithCuda ? "on" : "off");
      return 0;
    case io::Invocation::Action::print_config:
      if (root) fmt::print("{}", jobs::describe_run(inv.config, inv.world_size));
      return 0;
    case io::Invocation::Action::run:
      break;
  }
  // Before the deck check: a tp group across nodes is a placement problem worth a warning even
  // when the run goes on (or is refused for another reason).
  const std::string tp_warning = app::tp_placement_warning(mpi, inv.config);
  if (root && !tp_warning.empty()) fmt::print(stderr, "lmscale: warning: {}\n", tp_warning);
  Config cfg = jobs::resolve_runtime(inv.config, mpi.size());
  ops::Runtime rt(jobs::process_device(cfg), mpi.local_rank(), cfg.precision.tf32, cfg.precision.gemm_autotune);
  // Before any output: a run whose predicted memory cannot fit is a configuration error.
  agree_on_usage(mpi, [&] {
    rt.set_comm_sms(static_cast<int>(cfg.parallel.comm_sms));
    jobs::check_device_precision(cfg, rt);
    jobs::check_memory_fits(cfg, mpi.size(), mpi.local_size(), rt);
  });
  // One writer per output file (io/output_lock.h): rank 0 writes them (every rank its own trace)
  // and holds their locks until they are renamed into place; a second run writing one of them
  // stops here with exit 2.
  std::vector<std::unique_ptr<io::OutputLock>> locks;
  agree_on_usage(mpi, [&] { locks = io::lock_outputs(cfg, mpi.rank()); });
  io::ResultsFile out(cfg.run.output, root);
  try {
    out.write_provenance(cfg, mpi.size());
    app::write_system_info(out, mpi, rt);
    if (!tp_warning.empty()) out.set_attr("/system", "tp_placement_warning", tp_warning);
    // run.metrics: rank 0's JSON Lines stream, its deck line first (jobs/metrics_stream.h).
    jobs::MetricsStream metrics(cfg.run.metrics, cfg, io::planned_world(cfg, mpi.size()), root);
    jobs::JobEnv env{cfg, mpi, rt, out, mpi.rank(), mpi.size(), mpi.local_rank(), nullptr, nullptr,
                     metrics.active() ? &metrics : nullptr};
    // bench-collectives makes its own; the accounting job computes on its own and plans a run whose
    // backend this machine need not have.
    if (mpi.size() > 1 && cfg.run.job != JobKind::bench_collectives && cfg.run.job != JobKind::calibrate &&
        !predicts_only(cfg.run.job)) {
      // Gradients travel over the deck's backend; host scalars (losses, norms) over MPI.
      env.comm = comm::make_world_communicator(jobs::world_backend(cfg), mpi, mpi.local_rank(), false,
                                               static_cast<int>(cfg.parallel.comm_sms));
      env.host_comm = comm::make_world_communicator(comm::Backend::mpi, mpi, mpi.local_rank());
    }
    // run.trace: a recorder for this rank, its clock started at a barrier so the ranks line up;
    // installed as the main thread's active recorder for the job (core/trace.h).
    std::optional<trace::Recorder> recorder;
    if (!cfg.run.trace.empty()) {
      rt.synchronize();
      MPI_Barrier(mpi.world());
      recorder.emplace();
#ifdef LMSCALE_WITH_CUDA
      if (rt.device() == Device::cuda)
        recorder->set_device_timeline(trace::make_cuda_timeline(*recorder, rt.ctx().stream));
#endif
    }
    int code = 0;
    {
      trace::ActiveTrace active(recorder ? &*recorder : nullptr);
      code = jobs::run_job(env);
      rt.synchronize();
    }
    if (recorder) {
      recorder->finish_device();
      jobs::write_rank_trace(*recorder, cfg.run.trace, mpi.rank(), mpi.size(), comm::backend_name(jobs::world_backend(cfg)));
      MPI_Barrier(mpi.world());   // every rank's file is in place before rank 0 says so
      if (root && cfg.run.progress)
        fmt::print("trace written to {}{}\n", io::trace_rank_path(cfg.run.trace, 0),
                   mpi.size() > 1 ? fmt::format(" ... {}", io::trace_rank_path(cfg.run.trace, mpi.size() - 1)) : "");
    }
    // Which path (shm inside a node, network across nodes) the job's collectives took.
    app::write_comm_paths(out, {{"world", env.comm.get()}, {"host", env.host_comm.get()}});
    rt.synchronize();
    out.finish();
    // A non-zero code (75: preempted) makes mpirun/srun end the other ranks as soon as one exits:
    // none may exit before rank 0 has finished the results file.
    if (code != 0 && mpi.size() > 1) MPI_Barrier(mpi.world());
    if (root && cfg.run.progress) fmt::print("results written to {}\n", cfg.run.output);
    return code;
  } catch (...) {
    // No result yet: the file goes. Results: NAME.tmp stays, and the error says so.
    const std::int64_t rows = out.result_rows();
    const std::string kept = out.abandon();
    if (!kept.empty() && out.damaged())
      partial = fmt::format("the results written before the failure ({} table rows) are kept in '{}', but its last "
                            "write failed: if it does not open, `h5clear --increment {}` makes it readable (the rows "
                            "since its last flush may be lost); '{}' was not written",
                            rows, kept, kept, cfg.run.output);
    else if (!kept.empty())
      partial = fmt::format("the results written before the failure ({} table rows) are kept in '{}'; '{}' was not "
                            "written",
                            rows, kept, cfg.run.output);
    throw;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // A write past the file-size limit (RLIMIT_FSIZE, a quota) must fail with EFBIG and be reported
  // like a full disk, not kill the process with SIGXFSZ before it can say which file failed.
  std::signal(SIGXFSZ, SIG_IGN);
  lmscale::comm::MpiEnvironment mpi(&argc, &argv);
  // Terminates HDF5 before MPI, and not at all after a failed close (io/hdf5_library.h).
  lmscale::io::Hdf5Library hdf5;
  std::string partial;
  auto fail = [&](const std::string& message) {
    fmt::print(stderr, "lmscale: rank {}: error: {}\n", mpi.rank(), message);
    if (!partial.empty()) fmt::print(stderr, "lmscale: rank {}: {}\n", mpi.rank(), partial);
    std::fflush(stderr);
    if (mpi.size() > 1) mpi.abort(1);   // a failed rank ends the whole job
    return 1;
  };
  try {
    return run(mpi, argc, argv, partial);
  } catch (const lmscale::AgreedUsageError& e) {
    // Every rank failed the same way (they agreed on it): rank 0 speaks, all exit 2.
    if (mpi.rank() == 0) {
      fmt::print(stderr, "lmscale: error: {}\n", e.what());
      if (!partial.empty()) fmt::print(stderr, "lmscale: {}\n", partial);
    }
    return 2;
  } catch (const lmscale::UsageError& e) {
    if (mpi.size() == 1) {
      fmt::print(stderr, "lmscale: error: {}\n", e.what());
      if (!partial.empty()) fmt::print(stderr, "lmscale: {}\n", partial);
      return 2;
    }
    // Perhaps this rank's alone (found mid-job, after the agreed checks): the others may wait in a
    // collective and would never reach MPI_Finalize with it, so the job ends here with exit 2.
    // Rank 0 speaks at once. Another rank gives rank 0 kUsageGrace to end the job first, so that
    // an error every rank meets (a bench key every rank reads) is printed once; if it is still
    // running then, the error is its own: it names itself and ends the job.
    constexpr auto kUsageGrace = std::chrono::seconds(2);
    if (mpi.rank() != 0) std::this_thread::sleep_for(kUsageGrace);
    fmt::print(stderr, "lmscale: error: {}{}\n", mpi.rank() == 0 ? "" : fmt::format("rank {}: ", mpi.rank()),
               e.what());
    if (!partial.empty()) fmt::print(stderr, "lmscale: rank {}: {}\n", mpi.rank(), partial);
    mpi.abort(2);
    return 2;
  } catch (const std::bad_alloc& e) {
    return fail(fmt::format("out of host memory: {}", e.what()));
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
