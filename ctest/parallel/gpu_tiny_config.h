#pragma once
// The small model the 2-GPU suites of mpi_test_parallel_gpu train (test_parallel_gpu.cpp,
// test_ep_copy_engine_gpu.cpp): d_model 64, 2 blocks of 4 heads, bf16 with flash attention, on
// CUDA over NCCL, 50 KB gradient buckets (several per step), seed 4.
#include "lmscale/io/config.h"

namespace lmscale::test {

inline Config gpu_tiny_config() {
  Config c;
  c.model.vocab_size = 101;
  c.model.context_length = 32;
  c.model.d_model = 64;
  c.model.d_ff = 176;
  c.model.num_layers = 2;
  c.model.num_heads = 4;
  c.model.attention = AttentionImpl::flash;
  c.precision.mode = PrecisionMode::bf16;
  c.optim.lr = 3e-3;
  c.optim.warmup_steps = 1;
  c.parallel.device = DeviceChoice::cuda;
  c.parallel.backend = BackendChoice::nccl;
  c.parallel.bucket_mb = 0.05;
  c.run.seed = 4;
  return c;
}

}  // namespace lmscale::test
