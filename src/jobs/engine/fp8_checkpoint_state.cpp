// Delayed FP8 scaling's state for checkpoints (lmscale/jobs/engine/fp8_checkpoint_state.h).
#include "lmscale/jobs/engine/fp8_checkpoint_state.h"

#include <cmath>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/model/fp8_layers.h"

namespace lmscale::jobs {

namespace {

// Every operand of the model's FP8 layers in the saved order, or nothing without delayed scaling.
template <class F>
bool for_each_operand(Trainer& trainer, F&& f) {
  model::Fp8Layers* layers = trainer.recording_model().fp8();
  if (!layers || layers->options().recipe != ops::Fp8Recipe::delayed) return false;
  for (int l = layers->first_layer(); l < layers->end_layer(); ++l)
    for (const model::Fp8Gemm gemm : model::kFp8BlockGemms) {
      ops::Fp8Linear& lin = layers->at(l, gemm);
      f(lin.x_scaling());
      f(lin.w_scaling());
      f(lin.dy_scaling());
    }
  return true;
}

}  // namespace

std::optional<std::pair<std::int64_t, std::int64_t>> fp8_state_shape(Trainer& trainer) {
  std::int64_t operands = 0, history = 0;
  if (!for_each_operand(trainer, [&](ops::Fp8TensorScaling& s) {
        ++operands;
        history = s.amax_history().numel();
      }))
    return std::nullopt;
  return std::make_pair(operands, history);
}

std::optional<Fp8ScalingState> capture_fp8_state(JobEnv& env, Trainer& trainer) {
  Context& ctx = env.rt.ctx();
  env.rt.synchronize();
  Fp8ScalingState st;
  Tensor one = Tensor::empty({1}, DType::f32, *ctx.host, "fp8_checkpoint_state");
  const auto read_one = [&](const Tensor& t) {
    ops::copy(ctx, t, one);
    return *one.data_as<const float>();
  };
  if (!for_each_operand(trainer, [&](ops::Fp8TensorScaling& s) {
        const std::vector<float> h = s.history_oldest_first(ctx);
        st.history = static_cast<std::int64_t>(h.size());
        st.amax_history.insert(st.amax_history.end(), h.begin(), h.end());
        st.scale.push_back(read_one(s.scale()));
        st.inv_scale.push_back(read_one(s.inv_scale()));
        ++st.operands;
      }))
    return std::nullopt;
  return st;
}

void restore_fp8_state(JobEnv& env, Trainer& trainer, const Fp8ScalingState& state) {
  Context& ctx = env.rt.ctx();
  const auto shape = fp8_state_shape(trainer);
  LMSCALE_CHECK(shape && shape->first == state.operands && shape->second == state.history &&
                    static_cast<std::int64_t>(state.amax_history.size()) == state.operands * state.history &&
                    static_cast<std::int64_t>(state.scale.size()) == state.operands &&
                    static_cast<std::int64_t>(state.inv_scale.size()) == state.operands,
                "restore_fp8_state: a state of {} operands x {} amaxes for a model of {} x {}", state.operands,
                state.history, shape ? shape->first : 0, shape ? shape->second : 0);
  std::int64_t i = 0;
  for_each_operand(trainer, [&](ops::Fp8TensorScaling& s) {
    const auto first = state.amax_history.begin() + i * state.history;
    s.restore(ctx, std::vector<float>(first, first + state.history), state.scale[static_cast<std::size_t>(i)],
              state.inv_scale[static_cast<std::size_t>(i)]);
    ++i;
  });
  env.rt.synchronize();
}

void check_fp8_state(const Fp8ScalingState& state, const std::string& file) {
  for (std::size_t i = 0; i < state.scale.size(); ++i) {
    const float s = state.scale[i], inv = state.inv_scale[i];
    if (!(std::isfinite(s) && std::isfinite(inv) && s > 0.f && inv > 0.f && s * inv == 1.f))
      throw UsageError(fmt::format("train.resume: checkpoint '{}' holds FP8 scale {} with inverse {} for operand {}; "
                                   "the state is damaged: resume an earlier checkpoint",
                                   file, s, inv, i));
  }
}

std::optional<std::string> fp8_state_mismatch(const std::vector<std::int64_t>& saved, std::int64_t world,
                                              std::int64_t operands, std::int64_t H) {
  LMSCALE_CHECK(saved.size() == 3, "fp8_state_mismatch: a shape of {} dimensions (ranks, operands, amaxes)",
                saved.size());
  if (saved[1] != operands || saved[2] != H)
    return fmt::format("the checkpoint's FP8 scaling state is for {} operands x {} amaxes and this run has {} x {} "
                       "(another precision.fp8_history or model); set precision.fp8_history = {} to keep it",
                       saved[1], saved[2], operands, H, saved[2]);
  if (saved[0] != world)
    return fmt::format("the checkpoint's FP8 scaling state is of {} ranks and this run has {} (each data-parallel rank "
                       "scales its own rows); resume on {} ranks to keep it",
                       saved[0], world, saved[0]);
  return std::nullopt;
}

std::string fp8_state_absent() {
  return "the checkpoint holds no delayed FP8 scaling state (written with current scaling, another precision.mode "
         "or an older lmscale)";
}

}  // namespace lmscale::jobs
