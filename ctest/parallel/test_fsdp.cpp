// FSDP (ZeRO-3) must train to the weights of one process on the same global batch
// (docs/architecture.md §4): tiny Transformer, fp32 on CPU with 2, 3 and 4 ranks, a vocabulary (37) and unit sizes that
// no rank count divides (padded shards), with gradient accumulation, every prefetch window, both
// resharding choices and activation checkpointing. Within 2e-6 relative, like DDP: each rank's
// weight gradients come from GEMMs over its slice of the batch instead of the whole (another
// summation order). And each rank holds only its shards: parameters, gradients and AdamW state.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lmscale/io/deck.h"
#include "lmscale/parallel/fsdp.h"
#include "lmscale/parallel/sharded_optimizer.h"
#include "parallel_test_util.h"

using namespace lmscale;

namespace {
constexpr std::int64_t kBatch = 12;   // divisible by 2, 3 and 4 ranks

Config fsdp_config() {
  Config c = test::tiny_config();
  c.model.num_layers = 3;
  c.parallel.zero = ZeroLevel::fsdp;
  return c;
}
}  // namespace

TEST(Fsdp, TrainsToTheWeightsOfOneProcess) {
  const int steps = 4;
  Config one = fsdp_config();
  one.parallel.zero = ZeroLevel::none;
  const auto reference = test::train(one, false, steps, kBatch);
  struct Case {
    int accum, prefetch;
    bool reshard;
    const char* recompute;
    int k;
  };
  const int R = test::mpi_env().size();
  for (Case c : {Case{1, 1, true, "none", 1}, Case{2, 1, true, "none", 1}, Case{1, 0, true, "none", 1},
                 Case{1, 3, false, "none", 1}, Case{1, 1, true, "every-k", 1}, Case{2, 2, true, "every-k", 2},
                 Case{1, 1, false, "selective", 1}, Case{1, 2, true, "selective-mlp", 1}}) {
    if (kBatch / R % c.accum) continue;
    Config cfg = fsdp_config();
    cfg.train.grad_accum = c.accum;
    cfg.parallel.fsdp_prefetch = c.prefetch;
    cfg.parallel.reshard_after_forward = c.reshard;
    io::set_key(cfg, "train.activation_checkpointing", c.recompute);
    cfg.train.checkpoint_k = c.k;
    const auto got = test::train(cfg, true, steps, kBatch);
    ASSERT_EQ(got.size(), reference.size());
    EXPECT_LT(test::max_rel_diff(got, reference), 2e-6)
        << "accum " << c.accum << " prefetch " << c.prefetch << " reshard " << c.reshard << " " << c.recompute << " "
        << c.k;
  }
}

// SGD, LARS and LAMB under FSDP (issue 16): unit shards cut parameters anywhere (and are padded),
// so the per-parameter norms of LARS/LAMB are all-reduced partial sums; the replicated norms are
// excluded from the trust ratio.
TEST(Fsdp, OptimizersMatchOneProcess) {
  const int steps = 3;
  const int R = test::mpi_env().size();
  for (const char* name : {"sgd", "lars", "lamb"}) {
    Config one = test::with_optimizer(fsdp_config(), name);
    one.parallel.zero = ZeroLevel::none;
    const auto reference = test::train(one, false, steps, kBatch);
    EXPECT_GT(test::max_rel_diff(reference, test::train(one, false, 0, kBatch)), 1e-3) << name;
    for (int accum : {1, 2}) {
      if (kBatch / R % accum) continue;
      Config cfg = test::with_optimizer(fsdp_config(), name);
      cfg.train.grad_accum = accum;
      const auto got = test::train(cfg, true, steps, kBatch);
      ASSERT_EQ(got.size(), reference.size());
      EXPECT_LT(test::max_rel_diff(got, reference), 2e-6) << name << " accum " << accum;
    }
  }
}

TEST(Fsdp, EachRankHoldsOnlyItsShards) {
  auto& mpi = test::mpi_env();
  const int R = mpi.size();
  Config cfg = fsdp_config();
  ops::Runtime rt(Device::cpu, 0, false);
  io::ResultsFile out("/nonexistent/never-written.h5", false);
  jobs::JobEnv env{cfg, mpi, rt, out, mpi.rank(), R, 0, nullptr, nullptr};
  env.comm = comm::make_world_communicator(comm::Backend::mpi, mpi, 0);
  env.host_comm = comm::make_world_communicator(comm::Backend::mpi, mpi, 0);
  jobs::Trainer trainer(env, kBatch, 1, 2);
  ASSERT_NE(trainer.fsdp(), nullptr);
  EXPECT_FALSE(trainer.params().has_flat_params());
  io::SyntheticTokens data(cfg.model.vocab_size, cfg.run.seed);
  const std::int64_t T = cfg.model.context_length;
  std::vector<std::int32_t> tok(static_cast<std::size_t>(trainer.local_rows() * (T + 1)));
  data.sample(0, trainer.first_row(), trainer.local_rows(), T, tok.data(), false);
  trainer.train_step(tok, T);

  std::int64_t norms = 0;
  for (const auto& p : trainer.params().infos())
    if (p.kind == model::ParamInfo::Kind::norm) norms += p.numel;
  const std::int64_t sharded = trainer.params().numel() - norms;
  const int units = trainer.fsdp()->num_units();
  // Padding adds fewer than one element per unit to a shard.
  const std::int64_t max_shard = sharded / R + units;
  auto bytes = [&](const char* point, const char* tag) {
    const auto& tags = trainer.memory_points().at(point);
    auto it = tags.find(tag);
    return it == tags.end() ? std::int64_t{0} : static_cast<std::int64_t>(it->second);
  };
  EXPECT_LE(bytes("after_init", "parameters"), 4 * (max_shard + norms));
  EXPECT_GE(bytes("after_init", "parameters"), 4 * (sharded / R + norms));
  EXPECT_LE(bytes("after_init", "gradient_shard"), 4 * max_shard);
  // Outside a unit's backward only the replicated norm gradients exist; no gathered weights.
  EXPECT_EQ(bytes("before_optimizer", "gradients"), 4 * norms);
  EXPECT_EQ(bytes("before_optimizer", "fsdp_gathered"), 0);
  EXPECT_LE(static_cast<std::int64_t>(trainer.sharded()->state_bytes()), 8 * (max_shard + norms));
  // Every unit's gather was waited on in the forward and (but the embedding's) in the backward.
  const auto& w = trainer.fsdp()->waits();
  EXPECT_EQ(w.steps, 1);
  EXPECT_EQ(static_cast<int>(w.forward_ms.size()), units);
}
