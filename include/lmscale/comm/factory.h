#pragma once
// The world communicator of a run, for the backend the deck asks for (parallel.backend).
#include <memory>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/mpi_environment.h"

namespace lmscale::comm {

// backend: resolved by the caller from parallel.backend (jobs::world_backend: nccl for cuda
// devices, mpi for cpu, when the deck says auto). cuda_device: the GPU of this rank (usually env.local_rank()); ignored for mpi.
// Sets NCCL_NVLS_ENABLE=0 in the environment when it is unset, before any NCCL initialisation.
// nccl_max_ctas: parallel.comm_sms (NcclOptions::max_ctas); ignored for mpi.
std::unique_ptr<Communicator> make_world_communicator(Backend backend, MpiEnvironment& env,
                                                      int cuda_device, bool check = false, int nccl_max_ctas = 0);

}  // namespace lmscale::comm
