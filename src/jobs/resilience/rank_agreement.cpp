#include "lmscale/jobs/resilience/rank_agreement.h"

#include <exception>
#include <string>

#include <fmt/format.h>

#include "lmscale/comm/mpi_environment.h"
#include "lmscale/core/error.h"

namespace lmscale::jobs {

void agree_on_failure(JobEnv& env, const std::function<void()>& work, bool as_usage) {
  std::string message;
  int usage = as_usage ? 1 : 0;
  try {
    work();
  } catch (const UsageError& e) {
    message = e.what();
    usage = 1;
  } catch (const std::exception& e) {
    message = e.what();
    if (message.empty()) message = "unknown error";
  }
  const int size = env.mpi.size();
  if (size == 1) {
    if (message.empty()) return;
    if (usage) throw UsageError(message);
    throw Error(message);
  }
  // MPI directly (not the job's communicators): this must work whatever state they are in.
  int mine = message.empty() ? size : env.mpi.rank(), first = size;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, env.mpi.world());
  if (first == size) return;
  int header[2] = {static_cast<int>(message.size()), usage};
  MPI_Bcast(header, 2, MPI_INT, first, env.mpi.world());
  message.resize(static_cast<std::size_t>(header[0]));
  MPI_Bcast(message.data(), header[0], MPI_CHAR, first, env.mpi.world());
  const std::string text = first == 0 ? message : fmt::format("rank {}: {}", first, message);
  if (header[1]) throw AgreedUsageError(text);
  throw Error(text);
}

}  // namespace lmscale::jobs
