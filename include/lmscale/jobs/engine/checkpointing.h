#pragma once
// Saving and loading the trainer's state through io/checkpoint.h: final weights (one dataset per
// parameter name, fp32, loadable by h5py into a PyTorch state_dict), and training checkpoints
// (weights + AdamW m, v + step, loss scale, delayed FP8 scaling's state) that `train.resume`
// continues from exactly.
#include <optional>
#include <string>

#include "lmscale/jobs/engine/trainer.h"

namespace lmscale::jobs {

// Rank 0 writes; every rank must call (the weights are gathered from the device first).
void save_weights(JobEnv& env, Trainer& trainer, const std::string& path, bool with_optimizer_state);
// Collective. Every rank reads the file and restores weights (and optimizer state and step when
// present); a file that cannot continue the deck (unreadable, non-finite, another optimizer) on
// any rank is UsageError (exit 2) on every rank, agreed before anything is applied. Returns why
// delayed FP8 scaling's state (fp8_checkpoint_state.h) could not be restored, when the model
// needs it and the file does not hold it for this run's ranks; nullopt otherwise.
std::optional<std::string> load_checkpoint(JobEnv& env, Trainer& trainer, const std::string& path);

}  // namespace lmscale::jobs
