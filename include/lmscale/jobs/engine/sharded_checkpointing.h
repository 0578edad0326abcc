#pragma once
// Sharded training checkpoints of the trainer (io/sharded_checkpoint.h for the files,
// docs/checkpoints.md for the guarantees): every rank writes the pieces of state it owns
// (parallel/strategy.h: Strategy::state_layout) in parallel; rank 0 writes the index last. Loading reads, by name, the
// ranges this rank owns in its own layout from whichever files hold them.
#include <cstdint>
#include <optional>
#include <string>

#include "lmscale/jobs/engine/trainer.h"

namespace lmscale::jobs {

// Collective. Writes CHECKPOINT_DIR/step_NNNNNNNN/ for the trainer's current step (replacing an
// earlier attempt at the same step), then keeps the newest train.keep_checkpoints. Error (exit 1)
// on every rank when any rank failed to write; the index is then not written.
void save_sharded_checkpoint(JobEnv& env, Trainer& trainer);

// The step directory train.resume names for this deck: "" -> none; "auto" -> the newest complete
// checkpoint under train.checkpoint_dir, or none; a directory -> it. (A regular file is an old
// single-file checkpoint: io/checkpoint.h.) Same answer on every rank (rank 0 decides).
std::optional<std::string> resume_directory(JobEnv& env);

// Collective. Restores parameters, AdamW state, step, loss scale from STEP_DIR. A checkpoint of
// another model, a damaged or incomplete one: UsageError (exit 2) on every rank, naming the file
// and the problem. Restores delayed FP8 scaling's state (fp8_checkpoint_state.h) from this rank's
// file when the checkpoint was written by as many ranks; returns why it could not, when the model
// needs it (nullopt otherwise).
std::optional<std::string> load_sharded_checkpoint(JobEnv& env, Trainer& trainer, const std::string& step_dir);

// Collective. After an explicit train.resume (not auto) has been loaded at step `step`, with
// train.on_newer_checkpoints = move-aside: rank 0 moves the step folders of train.checkpoint_dir
// newer than `step` into train.checkpoint_dir/superseded-<UTC time>/ and says so, before the run
// writes or rotates any checkpoint (the deck check refused them otherwise: issue 36 item 3).
// Nothing to do for other decks. Error (exit 1) on every rank when a move fails.
void move_aside_newer_checkpoints(JobEnv& env, std::int64_t step);

}  // namespace lmscale::jobs
