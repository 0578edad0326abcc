#pragma once
// Shared by the parallel-mode tests: a tiny Transformer config and a few training steps of it on
// one process or on every rank of the MPI world, returning the final full parameters.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "lmscale/io/deck.h"
#include "lmscale/comm/factory.h"
#include "lmscale/io/dataset.h"
#include "lmscale/jobs/engine/trainer.h"
#include "mpi_test_support.h"

namespace lmscale::test {

// What the tests that drive a strategy directly (ZeroOptimizer, DataParallel) need on every rank:
// the gradient and host-scalar communicators over MPI and a host context.
struct HostRankEnv {
  std::unique_ptr<comm::Communicator> grads = comm::make_world_communicator(comm::Backend::mpi, mpi_env(), 0);
  std::unique_ptr<comm::Communicator> host = comm::make_world_communicator(comm::Backend::mpi, mpi_env(), 0);
  HostAllocator alloc;
  Context ctx;
  HostRankEnv() {
    ctx.allocator = &alloc;
    ctx.host = &alloc;
  }
};

// A CPU job environment for a Trainer: the runtime, an output that is never written and, when
// distributed, the MPI world's communicators (every rank of the world runs the job); otherwise
// this process alone. `cfg` must outlive it (JobEnv keeps a reference).
struct CpuJobEnv {
  ops::Runtime rt{Device::cpu, 0, false};
  io::ResultsFile out{"/nonexistent/never-written.h5", false};
  jobs::JobEnv env;
  explicit CpuJobEnv(const Config& cfg, bool distributed = true)
      : env{cfg, mpi_env(), rt, out, distributed ? mpi_env().rank() : 0, distributed ? mpi_env().size() : 1, 0,
            nullptr, nullptr} {
    if (!distributed) return;
    env.comm = comm::make_world_communicator(comm::Backend::mpi, mpi_env(), 0);
    env.host_comm = comm::make_world_communicator(comm::Backend::mpi, mpi_env(), 0);
  }
};

inline Config tiny_config() {
  Config c;
  c.model.vocab_size = 37;
  c.model.context_length = 8;
  c.model.d_model = 16;
  c.model.d_ff = 40;
  c.model.num_layers = 2;
  c.model.num_heads = 2;
  c.optim.lr = 1e-2;
  c.optim.min_lr = 1e-3;
  c.optim.warmup_steps = 1;
  c.optim.grad_clip = 0.5;   // exercised: the global norm must be the same under every layout
  c.parallel.device = DeviceChoice::cpu;
  c.parallel.backend = BackendChoice::mpi;
  c.parallel.bucket_mb = 0.004;   // several buckets even for this tiny model
  c.run.seed = 9;
  return c;
}

// What a few training steps produced: the logged (global mean) losses, the gradient norms before
// clipping and the final full parameters in the flat layout.
struct TrainRun {
  std::vector<double> losses, norms;
  std::vector<float> params;
};

// Trains `steps` steps of a global batch of B sequences under `cfg` on every rank (distributed)
// or on this process alone.
inline TrainRun train_run(const Config& cfg, bool distributed, int steps, std::int64_t B = 8) {
  CpuJobEnv job(cfg, distributed);
  const std::int64_t T = cfg.model.context_length;
  jobs::Trainer trainer(job.env, B, cfg.train.grad_accum, steps);
  io::SyntheticTokens data(cfg.model.vocab_size, cfg.run.seed);
  TrainRun r;
  for (int s = 0; s < steps; ++s) {
    std::vector<std::int32_t> tok(static_cast<std::size_t>(trainer.local_rows() * (T + 1)));
    data.sample(static_cast<std::uint64_t>(s), trainer.first_row(), trainer.local_rows(), T, tok.data(), false);
    const auto step = trainer.train_step(tok, T);
    r.losses.push_back(step.loss);
    r.norms.push_back(step.grad_norm);
  }
  r.params = trainer.full_parameters();   // collective under fsdp, tp and pp
  return r;
}

// The final full parameters only.
inline std::vector<float> train(const Config& cfg, bool distributed, int steps, std::int64_t B = 8) {
  return train_run(cfg, distributed, steps, B).params;
}

// `base` set up for optimizer `name` with hyper-parameters that move this tiny model visibly in a
// few steps (LARS's trust ratio makes its step about eta * lr of the weights' scale).
inline Config with_optimizer(Config c, const std::string& name) {
  io::set_key(c, "optim.name", name);
  c.optim.weight_decay = 0.01;
  if (name == "sgd") {
    c.optim.lr = 0.2, c.optim.min_lr = 0.02, c.optim.momentum = 0.9, c.optim.nesterov = true;
  } else if (name == "lars") {
    c.optim.lr = 5.0, c.optim.min_lr = 0.5, c.optim.momentum = 0.9, c.optim.trust_coefficient = 0.02;
  } else if (name == "lamb") {
    c.optim.lr = 2e-2, c.optim.min_lr = 2e-3;
  }
  return c;
}

inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return m / scale;
}

}  // namespace lmscale::test
