#pragma once
// The world communicator of a run, for the backend the deck asks for (parallel.backend).
#include <memory>
#include <string_view>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/mpi_environment.h"

namespace lmscale::comm {

// backend: "mpi" or "nccl" ("auto" must be resolved by the caller: nccl for cuda devices, mpi
// for cpu). cuda_device: the GPU of this rank (usually env.local_rank()); ignored for mpi.
// Sets NCCL_NVLS_ENABLE=0 in the environment when it is unset, before any NCCL initialisation.
// nccl_max_ctas: parallel.comm_sms (NcclOptions::max_ctas); ignored for mpi.
std::unique_ptr<Communicator> make_world_communicator(std::string_view backend, MpiEnvironment& env,
                                                      int cuda_device, bool check = false, int nccl_max_ctas = 0);

// "auto" -> "nccl" when device is cuda, "mpi" otherwise; other names are checked and returned.
Backend resolve_backend(std::string_view backend, Device device);

}  // namespace lmscale::comm
