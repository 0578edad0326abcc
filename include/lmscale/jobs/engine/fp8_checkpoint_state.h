#pragma once
// Delayed FP8 scaling's state in checkpoints (docs/checkpoints.md, "FP8 scaling state"): each FP8
// operand's amax history (oldest cast first), scale and inverse scale, per rank, since every
// data-parallel rank scales its own rows. With it a resumed delayed-scaling run casts with the
// scales the uninterrupted run would have used. Current scaling keeps no state between casts and
// saves none.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/jobs/job_env.h"

namespace lmscale::jobs {

// One rank's state. Operands in the order block, layer (model::kFp8BlockGemms: qkv, o, w13, w2),
// operand (x, w, dy), as the results file's /train/fp8_amax_history.
struct Fp8ScalingState {
  std::int64_t operands = 0, history = 0;
  std::vector<float> amax_history;   // [operands, history], oldest cast first
  std::vector<float> scale;          // [operands]
  std::vector<float> inv_scale;      // [operands]
};

// The names of the three arrays in checkpoints (io::write_weights' `state`, ShardWriter::write_state).
inline constexpr const char* kFp8HistoryName = "fp8_amax_history";
inline constexpr const char* kFp8ScaleName = "fp8_scale";
inline constexpr const char* kFp8InvScaleName = "fp8_inv_scale";

// This rank's state (device-to-host copies); nullopt unless the model runs FP8 layers under
// delayed scaling.
std::optional<Fp8ScalingState> capture_fp8_state(JobEnv& env, Trainer& trainer);
// The shape (operands, history) this rank's model would save; nullopt as above.
std::optional<std::pair<std::int64_t, std::int64_t>> fp8_state_shape(Trainer& trainer);
// Sets every operand's state from `state` (which must have fp8_state_shape's shape).
void restore_fp8_state(JobEnv& env, Trainer& trainer, const Fp8ScalingState& state);
// Refuses (UsageError naming `file`, exit 2) a state read from a checkpoint whose scales could not
// have been written: every scale and inverse finite, positive and each other's inverse (the
// amaxes may be NaN or inf: a cast records what it saw).
void check_fp8_state(const Fp8ScalingState& state, const std::string& file);
// Why a checkpoint's state of shape `saved` (ranks, operands, H; a sharded one's ranks are its
// writers) cannot be restored on `world` ranks of a model with `operands` x `H`, with what to do;
// nullopt when it can.
std::optional<std::string> fp8_state_mismatch(const std::vector<std::int64_t>& saved, std::int64_t world,
                                              std::int64_t operands, std::int64_t H);
// The reason for a checkpoint that holds no such state.
std::string fp8_state_absent();

}  // namespace lmscale::jobs
