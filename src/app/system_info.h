#pragma once
// /system/ranks: one row per rank (rank, host, local rank, device, device name, library
// versions), gathered to rank 0 over MPI.
#include "lmscale/comm/mpi_environment.h"
#include "lmscale/io/results.h"
#include "lmscale/ops/runtime.h"

namespace lmscale::app {
void write_system_info(io::ResultsFile& out, comm::MpiEnvironment& mpi, ops::Runtime& rt);
}
