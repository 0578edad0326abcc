#pragma once
// MpiCommunicator: the `mpi` backend, for host buffers (the CPU, "gloo-like" path).
//
// Execution: every call becomes a job on this communicator's single communication thread, run in
// call order, so an async collective overlaps the caller's compute. All MPI calls of the
// communicator happen on that thread (MPI_THREAD_MULTIPLE is still required because other
// communicators' threads and the main thread call MPI concurrently; without it jobs run inline).
// send/recv are posted (MPI_Isend/Irecv) and completed by the thread while later jobs run, so
// they never block each other.
//
// Algorithms (per communicator via set_algo, per call via CallOptions::algo):
//   library  MPI_Allreduce, MPI_Reduce_scatter(_block), MPI_Allgather(v), MPI_Bcast
//   ring     explicit ring over MPI_Sendrecv (reduce-scatter, then all-gather; broadcast as a
//            pipelined chain); any count, also count < size
//   shm      node-local shared-memory window (MPI_Win_allocate_shared), double-buffered chunks,
//            copies and reductions split over `shm_threads` threads; needs all ranks on one node
//   hier     all-reduce across nodes: shm inside each node, library between node leaders, shm
//            broadcast inside each node (other collectives: library)
//   auto     for count*elem >= shm_min_bytes: shm on one node, hier (all-reduce) across nodes
//            when some node holds several ranks; else library
// bf16/fp16 reductions accumulate in fp32 and round once: library and ring convert to fp32
// buffers (the ring sends fp32 partial sums), shm adds the ranks' 16-bit values in fp32 registers.
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "lmscale/comm/communicator.h"

namespace lmscale::comm {

struct MpiOptions {
  Algo algo = Algo::automatic;
  bool check = false;
  std::size_t shm_chunk_bytes = std::size_t{8} << 20;   // per staging buffer (two per rank)
  int shm_threads = 0;   // 0: $LMSCALE_SHM_THREADS if set, else min(8, cores / ranks on the node)
  std::size_t shm_min_bytes = std::size_t{64} << 10;     // auto: smaller messages use library
};

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm` (collective over it); the caller keeps ownership of `comm`.
  explicit MpiCommunicator(MPI_Comm comm, MpiOptions options = {});
  // Drains the queue (finishing queued work), then frees the duplicated communicators.
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::mpi; }
  Device device() const override { return Device::cpu; }
  std::string describe() const override;
  void set_algo(Algo a) override;
  Algo algo() const override { return options_.algo; }
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;

  // True when every rank of this communicator is on this node (shm is possible).
  bool node_local() const { return node_local_; }
  // Nodes the ranks of this communicator are on (MPI_COMM_TYPE_SHARED groups).
  int nodes() const { return nodes_; }
  std::vector<PathUse> path_uses() const override;
  // busy: a call of this communicator or of one split from it has not completed (no async errors:
  // MPI reports failures as the calls return).
  CommHealth health() const override;
  // True when work runs on the communication thread (MPI_THREAD_MULTIPLE).
  bool threaded() const;
  const MpiOptions& options() const { return options_; }

 protected:
  Work start(Request req) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  MpiOptions options_;
  void count_path(Algo algo, std::size_t bytes);

  int rank_ = 0, size_ = 1, nodes_ = 1;
  bool node_local_ = false;
  mutable std::mutex paths_mutex_;   // start() may be called from several threads
  std::vector<PathUse> paths_;
};

}  // namespace lmscale::comm
