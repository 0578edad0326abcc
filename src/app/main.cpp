// lmscale: reads a deck, sets up MPI, the device and the results file, runs one job.
// Exit codes: 0 ok, 1 runtime failure, 2 bad usage or deck (nothing run, nothing written).
#include <cstdio>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "lmscale/comm/factory.h"
#include "lmscale/comm/mpi_environment.h"
#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"
#include "lmscale/io/results.h"
#include "lmscale/jobs/dispatch.h"
#include "lmscale/jobs/job_env.h"
#include "lmscale/ops/runtime.h"
#include "lmscale/version.h"
#include "system_info.h"

namespace {

int run(lmscale::comm::MpiEnvironment& mpi, int argc, char** argv) {
  using namespace lmscale;
  const bool root = mpi.rank() == 0;
  io::Invocation inv = io::parse_invocation(argc, argv, mpi.size());
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
      if (root) fmt::print("{}", jobs::describe_run(inv.config, mpi.size()));
      return 0;
    case io::Invocation::Action::run:
      break;
  }
  // Before the deck check: a tp group across nodes is a placement problem worth a warning even
  // when the run goes on (or is refused for another reason).
  const std::string tp_warning = app::tp_placement_warning(mpi, inv.config);
  if (root && !tp_warning.empty()) fmt::print(stderr, "lmscale: warning: {}\n", tp_warning);
  Config cfg = jobs::resolve_runtime(inv.config, mpi.size());
  ops::Runtime rt(cfg.parallel.device == "cuda" ? Device::cuda : Device::cpu, mpi.local_rank(), cfg.precision.tf32,
                  cfg.precision.gemm_autotune);
  io::ResultsFile out(cfg.run.output, root);
  out.write_provenance(cfg, mpi.size());
  app::write_system_info(out, mpi, rt);
  if (!tp_warning.empty()) out.set_attr("/system", "tp_placement_warning", tp_warning);
  jobs::JobEnv env{cfg, mpi, rt, out, mpi.rank(), mpi.size(), mpi.local_rank(), nullptr, nullptr};
  if (mpi.size() > 1 && cfg.run.job != "bench-collectives") {
    // Gradients travel over the deck's backend; host scalars (losses, norms) over MPI.
    env.comm = comm::make_world_communicator(cfg.parallel.backend, mpi, mpi.local_rank());
    env.host_comm = comm::make_world_communicator("mpi", mpi, mpi.local_rank());
  }
  const int code = jobs::run_job(env);
  // Which path (shm inside a node, network across nodes) the job's collectives took.
  app::write_comm_paths(out, {{"world", env.comm.get()}, {"host", env.host_comm.get()}});
  rt.synchronize();
  out.finish();
  if (root && cfg.run.progress) fmt::print("results written to {}\n", cfg.run.output);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  lmscale::comm::MpiEnvironment mpi(&argc, &argv);
  try {
    return run(mpi, argc, argv);
  } catch (const lmscale::UsageError& e) {
    // Every rank parsed the same deck and failed the same way: rank 0 speaks, all exit 2.
    if (mpi.rank() == 0) fmt::print(stderr, "lmscale: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "lmscale: rank {}: error: {}\n", mpi.rank(), e.what());
    std::fflush(stderr);
    if (mpi.size() > 1) mpi.abort(1);   // a failed rank ends the whole job
    return 1;
  }
}
