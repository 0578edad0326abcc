#pragma once
// Independent GEMMs of a loop (the MoE experts' products, ops/moe_experts.cpp) spread over two
// streams, so that one product's last, partly empty wave of tiles (and its prologue and epilogue)
// runs beside the next product's first: cuBLASLt's Hopper kernels for an expert's ~2k rows are a
// single persistent wave of 120-132 CTAs that ends raggedly. Each lane has its own cuBLASLt
// workspace; the plans are shared (a plan's layouts are host attributes read at enqueue, and the
// lanes are fed by one host thread). The products and their bits are those of one stream: the same
// plans, the same algorithms, independent outputs.
//
// Usage: GemmLanes lanes(ctx); for each product i: lanes.use(i); gemm(...); then lanes.join()
// before anything reads the products (the destructor joins too, without throwing). Lane 0 is the
// compute stream.
// Only gemm() calls follow the lane (they queue on Resources::stream); other kernels stay on the
// context's stream.
#include <cstddef>

#include "resources.h"

namespace lmscale::ops::cuda {

class GemmLanes {
 public:
  explicit GemmLanes(Context& ctx);
  ~GemmLanes();
  GemmLanes(const GemmLanes&) = delete;
  GemmLanes& operator=(const GemmLanes&) = delete;

  // The following gemm() calls queue on lane i % 2 (lane 1 first waits for the compute stream's
  // work so far, once per fork).
  void use(std::size_t i);
  // The compute stream waits for every lane's products; gemm() calls queue on it again.
  void join();

 private:
  Resources& r_;
  cudaStream_t main_;
  void* main_workspace_;
  bool forked_ = false;
};

}  // namespace lmscale::ops::cuda
