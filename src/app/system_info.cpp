#include "system_info.h"

#include <mpi.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include <cblas.h>
#include <fmt/format.h>
#include <hdf5.h>
#ifdef LMSCALE_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace lmscale::app {

namespace {
constexpr int kFields = 10;
constexpr int kWidth = 64;   // bytes per string field

std::string library_versions_mpi() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string s(v, static_cast<std::size_t>(len));
  return s.substr(0, s.find_first_of(",\n"));
}
}  // namespace

void write_system_info(io::ResultsFile& out, comm::MpiEnvironment& mpi, ops::Runtime& rt) {
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  std::string nccl = "none", cuda = "none";
#ifdef LMSCALE_WITH_CUDA
  int nv = 0;
  if (ncclGetVersion(&nv) == ncclSuccess) nccl = fmt::format("{}.{}.{}", nv / 10000, (nv / 100) % 100, nv % 100);
  int rv = 0;
  if (cudaRuntimeGetVersion(&rv) == cudaSuccess) cuda = fmt::format("{}.{}", rv / 1000, (rv % 1000) / 10);
#endif
  const std::string device =
      rt.device() == Device::cuda ? fmt::format("cuda:{}", mpi.local_rank()) : std::string("cpu");
  const std::array<std::string, kFields> mine = {
      std::to_string(mpi.rank()), mpi.host(), std::to_string(mpi.local_rank()), device, rt.device_name(),
      library_versions_mpi(), fmt::format("{}.{}.{}", maj, min, rel), nccl, cuda,
      std::string(openblas_get_config())};
  std::vector<char> send(kFields * kWidth, 0);
  for (int f = 0; f < kFields; ++f) std::strncpy(send.data() + f * kWidth, mine[static_cast<std::size_t>(f)].c_str(), kWidth - 1);
  std::vector<char> all(static_cast<std::size_t>(mpi.size()) * send.size());
  MPI_Gather(send.data(), static_cast<int>(send.size()), MPI_CHAR, all.data(), static_cast<int>(send.size()), MPI_CHAR,
             0, MPI_COMM_WORLD);
  if (!out.active()) return;   // only rank 0 holds the gathered rows
  auto table = out.create_table("/system/ranks", io::system_ranks_columns());   // docs/hdf5.md
  for (int r = 0; r < mpi.size(); ++r) {
    auto field = [&](int f) { return std::string(all.data() + (static_cast<std::size_t>(r) * kFields + f) * kWidth); };
    table.append({static_cast<std::int64_t>(r), field(1), std::stoll(field(2)), field(3), field(4), field(5), field(6),
                  field(7), field(8), field(9)});
  }
}

}  // namespace lmscale::app
