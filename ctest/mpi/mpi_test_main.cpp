// GoogleTest main for the `mpi` label (run under mpirun with 2, 3 and 4 ranks): see
// run_mpi_tests in mpi_test_support.h.
#include "mpi_test_support.h"

int main(int argc, char** argv) {
  lmscale::comm::MpiEnvironment env(&argc, &argv);
  const int rc = lmscale::test::run_mpi_tests(env, &argc, argv);
  env.finalize();
  return rc;
}
