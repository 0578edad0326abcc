// parallel.offload = optimizer with a bf16 working copy on CPU ranks, against offload = none, bit for
// bit: one process, zero1 and zero2. CPU ranks cannot compute in bf16 (the CPU math is fp32/fp64),
// but they hold a bf16 working copy, cast it, and run AdamW with its fused bf16 write. So the
// forward and backward are replaced by their hooks, driven by hand, with synthetic gradients
// written where the backward would write them; everything after the backward is the trainer's:
// the gradient sync, the norm and clipping, the strategy's step, its waits in the next forward.
// This runs the store without the device fp32 master (ParameterStore::MasterCopy::read_ranges:
// the packed norm weights), the host master's targets, the gathers of the working copy and of the
// packed norm weights, the master read back from the host, and sharded checkpoints across offload
// on and off.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "lmscale/core/rng.h"
#include "lmscale/io/sharded_checkpoint.h"
#include "lmscale/jobs/predict/memory_model.h"
#include "lmscale/jobs/engine/sharded_checkpointing.h"
#include "lmscale/optim/grad_clip.h"
#include "lmscale/parallel/store_offload.h"
#include "lmscale/parallel/zero.h"
#include "parallel_test_util.h"

namespace lmscale::test {
namespace {

namespace fs = std::filesystem;

// What the forward reads after each step (the working copy's bits and the fp32 norm weights), the
// gradient norms, and the final master.
struct Reads {
  std::vector<std::vector<std::uint16_t>> lowp;
  std::vector<std::vector<float>> norms;
  std::vector<double> grad_norms;
  std::vector<float> master;
};

Config bf16_config(ZeroLevel zero, OffloadMode offload, const std::string& checkpoint_dir = "") {
  Config c = tiny_config();
  c.optim.weight_decay = 0.1;
  c.precision.mode = PrecisionMode::bf16;   // a bf16 working copy (no bf16 math runs here)
  c.parallel.zero = zero;
  c.parallel.offload = offload;
  c.train.checkpoint_dir = checkpoint_dir;
  c.train.keep_checkpoints = 10;
  return c;
}

void call(const std::function<void(int)>& f, int u) {
  if (f) f(u);
}

// One training step with the backward's hooks in the model's order (model/parallel_context.h) and
// gradient t of every parameter: a pure function of (step, parameter, element, dp rank).
void synthetic_step(jobs::Trainer& trainer, model::ParameterStore& store, Context& ctx, int t, int rank,
                    Reads& out) {
  parallel::Strategy& st = trainer.strategy();
  const int L = static_cast<int>(trainer.dims().layers);
  model::ParallelContext fwd = st.forward_hooks(true);
  const model::ParallelContext bwd = st.sync().hooks(0, 1);
  auto backward_unit = [&](int u) {
    call(bwd.before_backward, u);
    for (int i = store.size() - 1; i >= 0; --i) {
      if (parallel::forward_unit(store.infos()[static_cast<std::size_t>(i)], L) != u) continue;
      Tensor g = store.grad(i);
      const CounterRng rng(static_cast<std::uint64_t>(1000 * t + rank), static_cast<std::uint64_t>(i));
      for (std::int64_t e = 0; e < g.numel(); ++e)
        g.data_as<float>()[e] = static_cast<float>(rng.normal(static_cast<std::uint64_t>(e)) * 1e-2);
      if (bwd.on_grad_ready) bwd.on_grad_ready(i);
    }
    call(bwd.after_backward, u);
  };
  for (int u = 0; u <= L; ++u) {
    call(fwd.before_forward, u);
    call(fwd.after_forward, u);
  }
  call(fwd.before_forward, L + 1);
  // What the forward reads now: the last step's result (the waits above delivered it).
  if (t > 0) {
    std::vector<std::uint16_t> low(static_cast<std::size_t>(store.numel()));
    std::memcpy(low.data(), store.flat_lowp().data(), low.size() * sizeof(std::uint16_t));
    out.lowp.push_back(std::move(low));
    std::vector<float> norms;
    for (int i = 0; i < store.size(); ++i)
      if (store.infos()[static_cast<std::size_t>(i)].kind == model::ParamInfo::Kind::norm) {
        const Tensor w = store.compute_weight(i);
        EXPECT_EQ(w.dtype(), DType::f32);
        norms.insert(norms.end(), w.data_as<const float>(), w.data_as<const float>() + w.numel());
      }
    out.norms.push_back(std::move(norms));
  }
  backward_unit(L + 1);   // (fused into the training forward)
  call(fwd.after_forward, L + 1);
  for (int u = L; u >= 0; --u) backward_unit(u);
  st.sync().finish(ctx);
  const double norm = std::sqrt(st.grad_sum_squares(ctx));
  out.grad_norms.push_back(norm);
  st.step(ctx, 1e-2 / (t + 1), optim::clip_factor(norm, 0.5));
  st.release_gradients();
  trainer.set_step(t + 1);
}

// `steps` synthetic steps from `resume` (a step directory, or none), saving a checkpoint at
// step `save_at` when the deck names a checkpoint directory; then one forward's reads of the
// result and the master.
Reads run(const Config& cfg, bool distributed, int first, int steps, const std::string& resume = "", int save_at = -1) {
  CpuJobEnv job(cfg, distributed);
  jobs::Trainer trainer(job.env, 8, 1, steps);
  model::ParameterStore& store = trainer.params();
  EXPECT_TRUE(store.has_lowp());
  // The store holds the fp32 master only where the forward reads it under offload.
  const bool offload = cfg.parallel.offload != OffloadMode::none;
  EXPECT_EQ(store.has_whole_master(), !offload);
  const auto& tags = job.rt.allocator().tracker().by_tag();
  EXPECT_EQ(tags.at("parameters"), 4 * (offload ? store.master_read_numel() : store.numel()));
  EXPECT_EQ(tags.at("parameters_lowp"), 2 * store.numel());
  if (!resume.empty()) jobs::load_sharded_checkpoint(job.env, trainer, resume);
  Reads out;
  const int rank = distributed ? job.env.rank : 0;
  for (int t = first; t < first + steps; ++t) {
    synthetic_step(trainer, store, job.rt.ctx(), t, rank, out);
    if (t + 1 == save_at) jobs::save_sharded_checkpoint(job.env, trainer);
  }
  Reads last;
  synthetic_step(trainer, store, job.rt.ctx(), first + steps, rank, last);   // (its own step is not compared)
  out.lowp.push_back(last.lowp.back());
  out.norms.push_back(last.norms.back());
  out.master = trainer.full_parameters();
  return out;
}

void expect_same(const Reads& a, const Reads& b, const std::string& what) {
  ASSERT_EQ(a.lowp.size(), b.lowp.size()) << what;
  for (std::size_t s = 0; s < a.lowp.size(); ++s) {
    EXPECT_EQ(a.lowp[s], b.lowp[s]) << what << ": working copy after step " << s;
    EXPECT_EQ(0, std::memcmp(a.norms[s].data(), b.norms[s].data(), a.norms[s].size() * sizeof(float)))
        << what << ": fp32 norm weights after step " << s;
  }
  ASSERT_EQ(a.grad_norms.size(), b.grad_norms.size()) << what;
  for (std::size_t s = 0; s < a.grad_norms.size(); ++s) EXPECT_EQ(a.grad_norms[s], b.grad_norms[s]) << what << " step " << s;
  ASSERT_EQ(a.master.size(), b.master.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.master.data(), b.master.data(), a.master.size() * sizeof(float))) << what << ": master";
}

TEST(OffloadWorkingCopy, MatchesNoOffloadBitwise) {
  const int world = mpi_env().size();
  for (const ZeroLevel zero : {ZeroLevel::none, ZeroLevel::zero1, ZeroLevel::zero2}) {
    const bool distributed = zero != ZeroLevel::none;
    const std::string what = fmt::format("zero {} on {} rank(s)", zero, distributed ? world : 1);
    const Reads base = run(bf16_config(zero, OffloadMode::none), distributed, 0, 3);
    const Reads off = run(bf16_config(zero, OffloadMode::optimizer), distributed, 0, 3);
    expect_same(base, off, what);
    // The steps moved the weights (a comparison of untouched weights could not fail).
    EXPECT_NE(base.lowp.front(), base.lowp.back()) << what;
  }
}

// The memory model of a GPU run (jobs/predict/memory_model.h) counts what the store leaves out:
// the init phase without offload less the one with it is the fp32 master but for the packed norm
// weights (what the store above holds), plus AdamW's m and v of the owned range.
TEST(OffloadWorkingCopy, MemoryModelCountsTheFreedMaster) {
  const int world = mpi_env().size();
  for (const ZeroLevel zero : {ZeroLevel::none, ZeroLevel::zero1, ZeroLevel::zero2}) {
    const int ranks = zero == ZeroLevel::none ? 1 : world;
    auto init_bytes = [&](OffloadMode offload) {
      Config c = bf16_config(zero, offload);
      c.parallel.device = DeviceChoice::cuda;
      for (const auto& ph : jobs::predict_memory_phases(c, ranks, true, 0).phases)
        if (ph.phase == "init") return ph.bytes;
      ADD_FAILURE() << "no init phase";
      return 0.0;
    };
    ops::Runtime rt(Device::cpu, 0, false);
    model::ParameterStore store(model::ModelDims::from(tiny_config().model), DType::f32, DType::bf16, *rt.ctx().allocator,
                                model::ParameterStore::Buffers::params_only, {}, {model::StageUnits::all()}, {},
                                model::ParameterStore::MasterCopy::read_ranges);
    const double P = static_cast<double>(store.numel()), owned = static_cast<double>(parallel::even_split(store.numel(), ranks)[0]);
    EXPECT_EQ(init_bytes(OffloadMode::none) - init_bytes(OffloadMode::optimizer),
              4 * (P - static_cast<double>(store.master_read_numel())) + 8 * owned)
        << fmt::format("zero {} on {} rank(s)", zero, ranks);
  }
}

// Sharded checkpoints: offload on -> off and off -> on at step 2 of 4 continue as the
// uninterrupted run (the saved master is the host's; a load rebuilds the working copy and the
// norm weights from it).
TEST(OffloadWorkingCopy, ResumesAcrossOffloadBitwise) {
  const int world = mpi_env().size();
  const std::string dir = (fs::temp_directory_path() / fmt::format("lmscale_offload_wc_np{}", world)).string();
  for (const ZeroLevel zero : {ZeroLevel::none, ZeroLevel::zero1, ZeroLevel::zero2}) {
    const bool distributed = zero != ZeroLevel::none;
    // One process: every rank runs it (the checkpoint's agreement is over the MPI world), each
    // into a directory of its own.
    const int owner = distributed ? 0 : mpi_env().rank();
    const std::string what = fmt::format("zero {}", zero);
    const Reads whole = run(bf16_config(zero, OffloadMode::none), distributed, 0, 4);
    for (const OffloadMode first : {OffloadMode::optimizer, OffloadMode::none}) {
      const OffloadMode second = first == OffloadMode::none ? OffloadMode::optimizer : OffloadMode::none;
      const std::string d = fmt::format("{}_{}_{}_{}", dir, zero, first, owner);
      run(bf16_config(zero, first, d), distributed, 0, 2, "", 2);
      const Reads resumed = run(bf16_config(zero, second), distributed, 2, 2, io::checkpoint_step_dir(d, 2));
      // From the reads of the loaded state (step 1's result) on.
      Reads tail = whole;
      tail.lowp.erase(tail.lowp.begin(), tail.lowp.begin() + 1);
      tail.norms.erase(tail.norms.begin(), tail.norms.begin() + 1);
      tail.grad_norms.erase(tail.grad_norms.begin(), tail.grad_norms.begin() + 2);
      expect_same(tail, resumed, fmt::format("{}: offload {} -> {}", what, first, second));
      if (mpi_env().rank() == owner) fs::remove_all(d);
    }
  }
}

}  // namespace
}  // namespace lmscale::test
