#pragma once
// MpiEnvironment: MPI for the life of the process (RAII). main() makes one first and lets every
// communicator die before it. It asks for MPI_THREAD_MULTIPLE, because each MpiCommunicator runs
// its work on its own communication thread while the main thread may call MPI too; with a lower
// level, communicators run their work inline on the calling thread (no overlap) and say so once.
//
// A failing rank must end the whole job (other ranks would wait in a collective forever): main
// catches exceptions and calls abort(code) when size() > 1.
#include <mpi.h>

#include <string>

namespace lmscale::comm {

class MpiEnvironment {
 public:
  // argc/argv may be null. If MPI is already initialised (e.g. by a test harness), the object
  // uses it and does not finalise it.
  MpiEnvironment(int* argc, char*** argv);
  ~MpiEnvironment();   // finalize() unless done
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Rank among the processes of this node (MPI_Comm_split_type SHARED) and their count; the GPU
  // index of this rank is local_rank() (one rank per GPU).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& host() const { return host_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }
  // The thread level MPI provided and whether it is MPI_THREAD_MULTIPLE.
  int thread_level() const { return thread_level_; }
  bool thread_multiple() const { return thread_level_ >= MPI_THREAD_MULTIPLE; }
  // "Open MPI v4.1.4, ..." (MPI_Get_library_version, first line).
  std::string library_version() const;

  // Ends every rank of the job with `code` (MPI_Abort on MPI_COMM_WORLD).
  [[noreturn]] void abort(int code) const;
  // Finalises MPI (if this object initialised it). Idempotent.
  void finalize();

 private:
  bool owns_ = false;
  bool finalized_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::string host_;
};

}  // namespace lmscale::comm
