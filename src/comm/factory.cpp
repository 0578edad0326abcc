#include "lmscale/comm/factory.h"

#include <cstdlib>

#include <fmt/format.h>

#include "lmscale/comm/mpi_communicator.h"
#include "lmscale/comm/nccl_communicator.h"
#include "lmscale/comm/peer_copy.h"
#include "lmscale/core/error.h"

namespace lmscale::comm {

std::unique_ptr<Communicator> make_world_communicator(Backend backend, MpiEnvironment& env, int cuda_device,
                                                      bool check, int nccl_max_ctas) {
  switch (backend) {
    case Backend::mpi: {
      MpiOptions o;
      o.check = check;
      return std::make_unique<MpiCommunicator>(env.world(), o);
    }
    case Backend::nccl: {
      ::setenv("NCCL_NVLS_ENABLE", "0", 0);   // NVLink multicast stays off (docs/architecture.md, "GPUs")
      NcclOptions o;
      o.check = check;
      o.max_ctas = nccl_max_ctas;
      return make_nccl_communicator(env.world(), cuda_device, o);
    }
  }
  throw Error("unreachable backend");
}

#ifndef LMSCALE_WITH_CUDA
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, int, NcclOptions) {
  throw UsageError("parallel.backend=nccl: this lmscale was built without CUDA/NCCL; use parallel.backend=mpi");
}
std::string nccl_version() { return ""; }
std::unique_ptr<PeerCopyExchange> make_peer_copy_exchange(Communicator&, std::size_t, MemoryTracker*, int,
                                                          const PeerCopyUser& user) {
  throw UsageError(fmt::format("{} = copy-engine: this lmscale was built without CUDA; use {} = nccl", user.key,
                               user.key));
}
#endif

}  // namespace lmscale::comm
