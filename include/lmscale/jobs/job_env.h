#pragma once
// What every job gets from main(): the resolved configuration, where this process sits in the
// world, its compute runtime and the results file (active on rank 0 only).
#include <memory>
#include <string>

#include "lmscale/io/config.h"
#include "lmscale/io/results.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::comm {
class MpiEnvironment;
class Communicator;
}

namespace lmscale::jobs {

class MetricsStream;

struct JobEnv {
  const Config& cfg;
  comm::MpiEnvironment& mpi;
  ops::Runtime& rt;
  io::ResultsFile& out;
  int rank = 0, world = 1, local_rank = 0;
  // The world's communicator for device buffers (nccl on GPUs, mpi on CPUs) and an mpi one for
  // host scalars; null for jobs that make their own (bench-collectives).
  std::shared_ptr<comm::Communicator> comm;
  std::shared_ptr<comm::Communicator> host_comm;
  // run.metrics (jobs/metrics_stream.h): active on rank 0 when the deck names a file; may be null.
  MetricsStream* metrics = nullptr;
  bool is_root() const { return rank == 0; }
};

}  // namespace lmscale::jobs
