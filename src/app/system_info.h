#pragma once
// /system/ranks: one row per rank (rank, host, local rank, device, device name, library
// versions), gathered to rank 0 over MPI.
#include "lmscale/comm/mpi_environment.h"
#include "lmscale/io/results.h"
#include "lmscale/ops/runtime.h"

#include <string>
#include <utility>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/io/config.h"

namespace lmscale::app {
void write_system_info(io::ResultsFile& out, comm::MpiEnvironment& mpi, ops::Runtime& rt);

// Where the deck's tensor-parallel groups land: collective over the world (every rank's node).
// Empty when every tp group is inside one node (or tp = 1, or the mesh does not fit the world,
// which the deck check reports); otherwise a warning naming parallel.tp, the groups and hosts.
std::string tp_placement_warning(comm::MpiEnvironment& mpi, const Config& cfg);

// /system/comm_paths: per communicator, how many collectives (and bytes) took each path (this
// rank's counts; all ranks make the same calls). Rank 0 writes.
void write_comm_paths(io::ResultsFile& out,
                      const std::vector<std::pair<std::string, const comm::Communicator*>>& comms);
}
