// Main of the 2-GPU NCCL test (ctest/gpu/test_nccl_comm.cpp under mpirun -np 2, label gpu):
// every rank exits 77 (CTest "skipped") unless there are at least 2 ranks and a GPU per rank on
// the node; otherwise as mpi_test_main.cpp.
#include <cuda_runtime.h>

#include "mpi_test_support.h"

int main(int argc, char** argv) {
  lmscale::comm::MpiEnvironment env(&argc, &argv);
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  int mine = (env.size() >= 2 && gpus >= env.local_size()) ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, env.world());
  if (!all) {
    if (env.rank() == 0)
      std::printf("needs >= 2 ranks and one GPU per rank (%d ranks, %d GPUs here): skipping\n", env.size(), gpus);
    env.finalize();
    return 77;
  }
  const int rc = lmscale::test::run_mpi_tests(env, &argc, argv);
  env.finalize();
  return rc;
}
