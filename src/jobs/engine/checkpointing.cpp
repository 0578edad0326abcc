#include "lmscale/jobs/engine/checkpointing.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/core/host_vector.h"
#include "lmscale/comm/communicator.h"
#include "lmscale/io/checkpoint.h"
#include "lmscale/jobs/engine/fp8_checkpoint_state.h"
#include "lmscale/jobs/resilience/rank_agreement.h"
#include "lmscale/ops/ops.h"

namespace lmscale::jobs {

namespace {

// The whole flat fp32 buffer `flat` (on any device) copied to the host.
std::vector<float> to_host(Context& ctx, const Tensor& flat) {
  auto h = host_vector<float>(static_cast<std::size_t>(flat.numel()), "a host copy of the weights for saving");
  Tensor dst = Tensor::view(h.data(), {flat.numel()}, DType::f32, Device::cpu);
  ops::copy(ctx, flat, dst);
  return h;
}

// Files hold the full parameters by name (any layout can read them): `flat` is in the full
// model's layout, whatever slices this rank's store holds (tensor parallelism).
std::vector<io::NamedArray> named(const std::vector<model::ParamInfo>& full_layout, const std::vector<float>& flat) {
  std::vector<io::NamedArray> v;
  for (const auto& p : full_layout) v.push_back({p.name, p.shape, flat.data() + p.offset});
  return v;
}

}  // namespace

void save_weights(JobEnv& env, Trainer& trainer, const std::string& path, bool with_optimizer_state) {
  Context& ctx = env.rt.ctx();
  auto& ps = trainer.params();
  LMSCALE_CHECK(ps.master_dtype() == DType::f32, "weights files hold fp32 master weights");
  const auto full_layout = model::parameter_layout(trainer.dims());
  const std::vector<float> params = trainer.full_parameters();   // collective under fsdp, tp and pp
  std::vector<float> m, v;
  io::OptimizerArrays opt;
  if (with_optimizer_state) {
    if (!trainer.optimizer()) throw UsageError("train.checkpoint_every: checkpoints with a sharded optimizer (parallel.zero) are not supported yet; save final weights with train.save");
    // State 0 is m, state 1 (adamw, lamb) v: sgd and lars keep their momentum buffer in m.
    optim::Optimizer& o = *trainer.optimizer();
    m = trainer.to_full_layout(to_host(ctx, o.state(0)));   // collective under tp and pp
    opt.m = named(full_layout, m);
    if (o.num_states() > 1) {
      v = trainer.to_full_layout(to_host(ctx, o.state(1)));
      opt.v = named(full_layout, v);
    }
  }
  // Delayed FP8 scaling's state, every rank's (each scales its own rows): [world, operands, H].
  const auto gathered = [&](const std::vector<float>& mine) {
    if (env.world == 1) return mine;
    std::vector<float> all(mine.size() * static_cast<std::size_t>(env.world));
    env.host_comm->all_gather(mine.data(), all.data(), mine.size(), DType::f32).wait();
    return all;
  };
  std::vector<float> fp8_history, fp8_scale, fp8_inv_scale;
  std::vector<io::NamedArray> state;
  if (with_optimizer_state)
    if (const auto st = capture_fp8_state(env, trainer)) {
      fp8_history = gathered(st->amax_history);
      fp8_scale = gathered(st->scale);
      fp8_inv_scale = gathered(st->inv_scale);
      state = {{kFp8HistoryName, {env.world, st->operands, st->history}, fp8_history.data()},
               {kFp8ScaleName, {env.world, st->operands}, fp8_scale.data()},
               {kFp8InvScaleName, {env.world, st->operands}, fp8_inv_scale.data()}};
    }
  if (!env.is_root()) return;
  std::map<std::string, io::AttrValue> attrs{
      {"step", trainer.step()},
      {"optimizer_steps", trainer.optimizer() ? trainer.optimizer()->steps() : trainer.step()},
      {"optimizer", to_string(env.cfg.optim.name)},
      {"seed", static_cast<std::int64_t>(env.cfg.run.seed)},
      {"loss_scale", trainer.loss_scaler().scale()},
      {"config", env.cfg.resolved},
      {"num_heads", env.cfg.model.num_heads},
      {"rope_theta", env.cfg.model.rope_theta},
  };
  // full_parameters() is in the whole model's layout whatever this rank holds (tensor slices,
  // pipeline stages): name it by that layout.
  io::write_weights(path, named(full_layout, params), attrs, with_optimizer_state ? &opt : nullptr,
                    state.empty() ? nullptr : &state);
}

// Weights and optimizer state read from a file must be finite: a NaN would make every step skip
// ("skipped: overflow") for ever (issue 36). Exit 2 naming the file and the parameter.
template <class Layout>
void require_finite(const std::string& path, const std::string& what, const Layout& layout,
                    const std::vector<float>& flat) {
  for (const auto& p : layout)
    for (std::int64_t i = 0; i < p.numel; ++i)
      if (!std::isfinite(flat[static_cast<std::size_t>(p.offset + i)]))
        throw UsageError(fmt::format("train.resume = '{}': {} of '{}' hold a non-finite value ({}) at element {}; the "
                                     "file is damaged or was saved by a diverged run: resume an earlier one",
                                     path, what, p.name, flat[static_cast<std::size_t>(p.offset + i)], i));
}

std::optional<std::string> load_checkpoint(JobEnv& env, Trainer& trainer, const std::string& path) {
  Context& ctx = env.rt.ctx();
  // Full parameters by name, sliced by the trainer for this rank's layout.
  const auto full_layout = model::parameter_layout(trainer.dims());
  const auto numel = static_cast<std::size_t>(full_layout.back().offset + full_layout.back().numel);
  // Read and checked on every rank before any is applied, and agreed on: per-node copies of the
  // file can differ, and a rank that alone found its copy bad would otherwise leave the others
  // waiting in the first step (exit 2 on every rank, issue 36 item 1).
  std::vector<float> flat(numel);
  std::vector<std::vector<float>> states;   // the optimizer's m (and v), full layout
  std::int64_t step = 0, optimizer_steps = 0;
  std::optional<double> loss_scale;
  // Delayed FP8 scaling's state of this rank, or why the file cannot give it.
  const auto fp8_shape = fp8_state_shape(trainer);
  std::optional<Fp8ScalingState> fp8;
  std::optional<std::string> fp8_missing;
  agree_on_failure(env, [&] {
    try {
      io::CheckpointReader r(path);
      for (const auto& p : full_layout) r.read(p.name, p.shape, flat.data() + p.offset);
      require_finite(path, "the weights", full_layout, flat);
      if (!r.has_optimizer_state()) return;   // a weights file: fresh optimizer, step 0
      if (!trainer.optimizer())
        throw UsageError("train.resume: resuming optimizer state with parallel.zero is not supported yet");
      // Checkpoints from before issue 16 carry no optimizer name: they are AdamW's.
      std::string written_by = "adamw";
      if (auto a = r.attr("optimizer"); a && std::holds_alternative<std::string>(*a))
        written_by = std::get<std::string>(*a);
      const optim::Optimizer& o = *trainer.optimizer();
      if (written_by != o.name())
        throw UsageError("train.resume: checkpoint " + path + " holds the state of optim.name = " + written_by +
                         " but the deck asks for " + o.name() + "; set optim.name = " + written_by +
                         " (optimizer state belongs to the optimizer that wrote it)");
      for (int k = 0; k < o.num_states(); ++k) {
        const char* moment = k == 0 ? "m" : "v";
        states.emplace_back(numel);
        for (const auto& p : full_layout) r.read_optimizer(moment, p.name, p.shape, states.back().data() + p.offset);
        require_finite(path, fmt::format("the optimizer state {}", moment), full_layout, states.back());
      }
      auto get = [&](const char* name) -> std::int64_t {
        auto a = r.attr(name);
        if (!a || !std::holds_alternative<std::int64_t>(*a))
          throw Error(std::string("checkpoint ") + path + " lacks attribute " + name);
        return std::get<std::int64_t>(*a);
      };
      step = get("step");
      optimizer_steps = get("optimizer_steps");
      if (auto ls = r.attr("loss_scale"); ls && std::holds_alternative<double>(*ls)) loss_scale = std::get<double>(*ls);
      if (fp8_shape) {
        const auto [ops_n, H] = *fp8_shape;
        const std::vector<std::int64_t> want{env.world, ops_n, H};
        const auto saved = r.state_shape(kFp8HistoryName);
        if (saved && saved->size() != 3)
          throw Error(fmt::format("its FP8 amax history has {} dimensions, not 3 (ranks, operands, amaxes)",
                                  saved->size()));
        if (!saved) {
          fp8_missing = fp8_state_absent();
        } else if (auto why = fp8_state_mismatch(*saved, env.world, ops_n, H)) {
          fp8_missing = std::move(why);
        } else {
          // This rank's row of a [world, count] array.
          const auto my_row = [&](const char* name, std::vector<std::int64_t> shape, std::int64_t count) {
            std::vector<float> all(static_cast<std::size_t>(env.world * count));
            r.read_state(name, shape, all.data());
            const auto first = all.begin() + env.rank * count;
            return std::vector<float>(first, first + count);
          };
          fp8 = Fp8ScalingState{ops_n, H, my_row(kFp8HistoryName, want, ops_n * H),
                                my_row(kFp8ScaleName, {env.world, ops_n}, ops_n),
                                my_row(kFp8InvScaleName, {env.world, ops_n}, ops_n)};
          check_fp8_state(*fp8, path);
        }
      }
    } catch (const Error& e) {   // io: a damaged, truncated or unreadable file (named in the message)
      throw UsageError(fmt::format("train.resume = '{}' cannot be read: {}", path, e.what()));
    }
  }, true);
  trainer.set_parameters(flat);
  if (states.empty()) return std::nullopt;
  optim::Optimizer& o = *trainer.optimizer();
  for (int k = 0; k < o.num_states(); ++k) {
    std::vector<float> local = trainer.to_local_layout(states[static_cast<std::size_t>(k)]);
    Tensor src = Tensor::view(local.data(), {static_cast<std::int64_t>(local.size())}, DType::f32, Device::cpu);
    ops::copy(ctx, src, o.state(k));
  }
  trainer.set_step(step);
  trainer.optimizer()->set_steps(optimizer_steps);
  if (loss_scale) trainer.loss_scaler().set_scale(*loss_scale);
  if (fp8) restore_fp8_state(env, trainer, *fp8);
  return fp8_missing;
}

}  // namespace lmscale::jobs
