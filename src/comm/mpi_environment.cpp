#include "lmscale/comm/mpi_environment.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "lmscale/core/error.h"

namespace lmscale::comm {

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_) != MPI_SUCCESS)
      throw Error("MPI_Init_thread failed");
    owns_ = true;
  } else {
    MPI_Query_thread(&thread_level_);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);

  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);

  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  host_.assign(name, static_cast<std::size_t>(len));
}

MpiEnvironment::~MpiEnvironment() { finalize(); }

std::string MpiEnvironment::library_version() const {
  std::vector<char> buf(MPI_MAX_LIBRARY_VERSION_STRING, '\0');
  int len = 0;
  MPI_Get_library_version(buf.data(), &len);
  std::string v(buf.data(), static_cast<std::size_t>(len));
  if (auto end = v.find_first_of(std::string("\r\n\0", 3)); end != std::string::npos) v.resize(end);
  return v;
}

void MpiEnvironment::abort(int code) const {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);   // MPI_Abort does not return; keep the compiler and a broken MPI honest
}

void MpiEnvironment::finalize() {
  if (finalized_) return;
  finalized_ = true;
  int done = 0;
  MPI_Finalized(&done);
  if (owns_ && !done) MPI_Finalize();
}

}  // namespace lmscale::comm
