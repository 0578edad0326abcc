#include "system_info.h"

#include <mpi.h>

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include <cblas.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <hdf5.h>
#include "lmscale/comm/mesh.h"
#include "lmscale/core/cpu_model.h"
#include "lmscale/core/error.h"
#ifdef LMSCALE_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace lmscale::app {

namespace {
constexpr int kFields = 10;
constexpr int kWidth = 256;   // bytes per gathered string field (BLAS configurations run long)

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
      std::to_string(mpi.rank()), mpi.host(), std::to_string(mpi.local_rank()), device,
      rt.device() == Device::cuda ? rt.device_name() : cpu_model_name(),
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

std::string tp_placement_warning(comm::MpiEnvironment& mpi, const Config& cfg) {
  const auto& p = cfg.parallel;
  if (p.tp <= 1 || mpi.size() <= 1) return "";
  comm::MeshShape shape;
  try {
    shape = comm::resolve_mesh(comm::MeshShape{static_cast<int>(p.dp), static_cast<int>(p.tp), static_cast<int>(p.pp), 0},
                               mpi.size());
  } catch (const UsageError&) {
    return "";   // the deck check names the mismatch
  }
  // Node id of a rank = world rank of its node's first rank (local rank 0), gathered everywhere.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, mpi.rank(), MPI_INFO_NULL, &node);
  int leader = mpi.rank();
  MPI_Bcast(&leader, 1, MPI_INT, 0, node);
  MPI_Comm_free(&node);
  std::vector<int> node_of(static_cast<std::size_t>(mpi.size()));
  MPI_Allgather(&leader, 1, MPI_INT, node_of.data(), 1, MPI_INT, MPI_COMM_WORLD);
  const auto spanning = comm::groups_across_nodes(shape, comm::Axis::tp, node_of);
  if (spanning.empty()) return "";
  std::vector<std::string> hosts_of(static_cast<std::size_t>(mpi.size()));
  {
    std::vector<char> mine(kWidth, 0), all(static_cast<std::size_t>(mpi.size()) * kWidth);
    std::strncpy(mine.data(), mpi.host().c_str(), kWidth - 1);
    MPI_Allgather(mine.data(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 0; r < mpi.size(); ++r) hosts_of[static_cast<std::size_t>(r)] = std::string(all.data() + r * kWidth);
  }
  const auto& g = spanning.front();
  std::vector<std::string> where;
  for (int r : g) where.push_back(fmt::format("{}@{}", r, hosts_of[static_cast<std::size_t>(r)]));
  return fmt::format(
      "parallel.tp={}: {} of {} tensor-parallel group(s) span nodes (e.g. ranks {}); their two all-reduces per "
      "sublayer will cross the network. Use tp <= ranks per node ({} here) and launch ranks node by node "
      "(srun's default block distribution)",
      p.tp, spanning.size(), mpi.size() / p.tp, fmt::join(where, ","), mpi.local_size());
}

void write_comm_paths(io::ResultsFile& out,
                      const std::vector<std::pair<std::string, const comm::Communicator*>>& comms) {
  if (!out.active()) return;
  using T = io::Column::Type;
  auto table = out.create_table("/system/comm_paths", {{"communicator", T::str, ""},
                                                      {"backend", T::str, ""},
                                                      {"ranks", T::i64, ""},
                                                      {"path", T::str, ""},
                                                      {"calls", T::i64, "calls"},
                                                      {"bytes", T::i64, "bytes"}});
  for (const auto& [name, c] : comms) {
    if (!c) continue;
    for (const auto& u : c->path_uses())
      table.append({name, std::string(comm::backend_name(c->backend())), static_cast<std::int64_t>(c->size()), u.path,
                    static_cast<std::int64_t>(u.calls), static_cast<std::int64_t>(u.bytes)});
  }
}

}  // namespace lmscale::app
