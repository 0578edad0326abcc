// The deck's checkpoint keys against the files they name (docs/checkpoints.md): the resume
// source opened and compared with the model, the optimizer and train.steps before any work, and
// the newer checkpoints a resume from an older step would meet (issue 36).
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "deck_validate.h"
#include "lmscale/core/error.h"
#include "lmscale/io/checkpoint.h"
#include "lmscale/io/sharded_checkpoint.h"

namespace lmscale::io::detail {

namespace {

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw UsageError(fmt::format(format, std::forward<Args>(args)...));
}

// Checkpoints against the optimizer layout, and the file to resume from opened before any work
// (a sharded optimizer, parallel.zero on more than one rank, cannot write or read optimizer state
// yet: refused here rather than after the run has measured something).
// A checkpoint's optimizer state belongs to the optimizer that wrote it (attribute `optimizer`;
// absent before issue 16 = adamw).
void check_resume_optimizer(const Config& c, const std::map<std::string, AttrValue>& attrs, const std::string& where) {
  std::string written_by = "adamw";
  if (auto it = attrs.find("optimizer"); it != attrs.end() && std::holds_alternative<std::string>(it->second))
    written_by = std::get<std::string>(it->second);
  if (written_by != name_of(c.optim.name))
    fail("optim.name = {}: train.resume = '{}' holds the optimizer state of optim.name = {}; set optim.name = {} to "
         "resume it",
         c.optim.name, where, written_by, written_by);
}

// The step a checkpoint continues from lies in [0, train.steps): a negative step would train with a
// negative learning rate, and a step at or past the end would run zero steps without a word.
// Exception: train.resume = auto finding the checkpoint at exactly train.steps is a completed run
// requeued again; it has nothing to do and says so (train.cpp), exit 0.
// Resuming an older step into a train.checkpoint_dir that holds newer checkpoints: the rotation
// (train.keep_checkpoints) would delete the new lineage and the source and keep the stale newer
// ones, and a later train.resume = auto would continue the wrong history (issue 36 item 3). With
// train.on_newer_checkpoints = move-aside the run moves them aside after loading the resume
// source (jobs/engine/sharded_checkpointing.h); the check touches nothing.
void check_no_newer_checkpoints(const Config& c, std::int64_t step) {
  if (c.train.checkpoint_dir.empty() || c.train.resume == "auto") return;
  if (c.train.on_newer_checkpoints == NewerCheckpoints::move_aside) return;
  std::vector<std::string> newer;
  for (const auto& [s, path] : complete_checkpoints(c.train.checkpoint_dir))
    if (s > step) newer.push_back(std::filesystem::path(path).filename().string());
  if (newer.empty()) return;
  if (newer.size() > 4) newer.erase(newer.begin() + 3, newer.end() - 1), newer.insert(newer.end() - 1, "...");
  fail("train.resume = '{}' continues from step {}, but train.checkpoint_dir = '{}' holds newer checkpoints ({}): "
       "rotation would delete the new ones and keep those, and train.resume = auto would later continue their "
       "history; set train.on_newer_checkpoints = move-aside to have them moved into '{}/superseded-<time>/', move "
       "them out of '{}' yourself, give another train.checkpoint_dir, or resume with train.resume = auto",
       c.train.resume, step, c.train.checkpoint_dir, fmt::join(newer, ", "), c.train.checkpoint_dir,
       c.train.checkpoint_dir);
}

void check_resume_step(const Config& c, std::int64_t step, const std::string& where) {
  if (c.train.resume == "auto" && step == c.train.steps) return;
  if (step < 0)
    fail("train.resume = '{}': the checkpoint's step is {}, which is negative; the checkpoint is damaged: give another "
         "one",
         where, step);
  if (step >= c.train.steps)
    fail("train.resume = '{}': the checkpoint is at step {} but train.steps = {}, so nothing is left to train; raise "
         "train.steps above {} to continue, or resume an earlier checkpoint",
         c.train.resume == "auto" ? where : c.train.resume, step, c.train.steps, step);
  check_no_newer_checkpoints(c, step);
}

}  // namespace

// A single-file checkpoint or weights file against the model keys that change the function
// (issue 36): layers, heads, vocabulary, width, rope_theta and norm_eps must match, not only the
// shapes that happen to be read (more layers in the file were ignored, another num_heads,
// rope_theta or norm_eps accepted).
std::optional<std::string> weights_mismatch(const Config& c, const CheckpointReader& r) {
  const auto& m = c.model;
  if (r.has("token_embeddings.weight")) {
    const auto shape = r.shape("token_embeddings.weight");
    if (shape != std::vector<std::int64_t>{m.vocab_size, m.d_model})
      return fmt::format("its token embedding is [{}] but model.vocab_size x model.d_model = [{}, {}]",
                         fmt::join(shape, ", "), m.vocab_size, m.d_model);
  }
  if (m.num_layers >= 1 && !r.has(fmt::format("layers.{}.ln1.weight", m.num_layers - 1)))
    return fmt::format("it has fewer blocks than model.num_layers = {}", m.num_layers);
  if (r.has(fmt::format("layers.{}.ln1.weight", m.num_layers)))
    return fmt::format("it has more blocks than model.num_layers = {}", m.num_layers);
  // The keys no shape shows (num_heads, rope_theta, norm_eps) and the rest as recorded.
  if (auto problem = recorded_model_mismatch(m, r.attrs())) return problem;
  return std::nullopt;
}

void check_checkpoints(const Config& c, int world_size) {
  if (c.run.job != JobKind::train) return;
  const bool sharded = c.parallel.zero != ZeroLevel::none && resolved_dp(c, world_size) > 1;
  if (sharded && c.train.checkpoint_every > 0 && c.train.checkpoint_dir.empty())
    fail("train.checkpoint_every = {}: a sharded optimizer (parallel.zero = {}) writes sharded checkpoints only; set "
         "train.checkpoint_dir = DIR (train.checkpoint_path is the single-file format of one process and DDP)",
         c.train.checkpoint_every, c.parallel.zero);
  if (c.train.resume.empty()) return;
  // Sharded: the step directory named, or the newest complete one under checkpoint_dir.
  std::string step_dir;
  std::error_code ec;
  if (c.train.resume == "auto") {
    const auto complete = complete_checkpoints(c.train.checkpoint_dir);
    if (complete.empty()) return;   // a fresh start
    step_dir = complete.back().second;
  } else if (std::filesystem::is_directory(c.train.resume, ec)) {
    step_dir = c.train.resume;
  }
  if (!step_dir.empty()) {
    CheckpointIndex index;
    try {
      index = read_index(step_dir);
    } catch (const Error& e) {
      // A checkpoint directory given where a step directory is expected: say which to give.
      const auto inside = complete_checkpoints(step_dir);
      if (!inside.empty())
        fail("train.resume = '{}' is a directory of checkpoints, not one checkpoint; give one of its step directories "
             "(the newest complete is '{}'), or set train.resume = auto and train.checkpoint_dir = '{}'",
             c.train.resume, inside.back().second, c.train.resume);
      fail("train.resume = '{}': {}; give a complete checkpoint (a step directory with {})", c.train.resume, e.what(),
           kIndexFile);
    }
    const std::map<std::string, std::int64_t> dims{{"vocab_size", c.model.vocab_size}, {"d_model", c.model.d_model},
                                                    {"d_ff", c.model.d_ff},           {"num_layers", c.model.num_layers},
                                                    {"num_heads", c.model.num_heads}};
    std::optional<std::string> problem;
    try {
      problem = model_mismatch(index, dims);
    } catch (const Error& e) {
      problem = e.what();
    }
    if (!problem) problem = recorded_model_mismatch(c.model, index.attrs);
    if (problem)
      fail("train.resume = '{}': checkpoint '{}/{}' does not fit the deck: {}", c.train.resume, step_dir, kIndexFile,
           *problem);
    check_resume_optimizer(c, index.attrs, step_dir);
    std::int64_t step = 0;
    try {
      step = index.int_attr("step");
    } catch (const Error& e) {
      fail("train.resume = '{}': {}; give a complete checkpoint written by lmscale", c.train.resume, e.what());
    }
    check_resume_step(c, step, step_dir);
    return;
  }
  bool optimizer_state = false;
  std::int64_t file_d_ff = c.model.d_ff;
  std::optional<std::string> model_problem;
  try {
    const CheckpointReader r(c.train.resume);
    optimizer_state = r.has_optimizer_state();
    if (r.has("layers.0.ffn.w1.weight")) file_d_ff = r.shape("layers.0.ffn.w1.weight")[0];
    model_problem = weights_mismatch(c, r);
  } catch (const Error& e) {
    fail("train.resume = '{}' is not a readable lmscale checkpoint ({}); give a file written by train.save or "
         "train.checkpoint_every",
         c.train.resume, e.what());
  }
  // A structurally pruned export (run.job = prune) has a smaller d_ff: say which to set.
  if (file_d_ff != c.model.d_ff)
    fail("train.resume = '{}' holds FFN weights of d_ff = {} but model.d_ff = {}; set model.d_ff = {}", c.train.resume,
         file_d_ff, c.model.d_ff, file_d_ff);
  if (model_problem)
    fail("train.resume = '{}' does not fit the deck: {}; set the [model] keys of the run that wrote it", c.train.resume,
         *model_problem);
  if (!optimizer_state) check_no_newer_checkpoints(c, 0);   // a weights file starts at step 0
  if (optimizer_state) {
    const auto attrs = CheckpointReader(c.train.resume).attrs();
    check_resume_optimizer(c, attrs, c.train.resume);
    const auto it = attrs.find("step");
    if (it == attrs.end() || !std::holds_alternative<std::int64_t>(it->second))
      fail("train.resume = '{}' holds optimizer state but no integer attribute 'step'; give a checkpoint written by "
           "train.checkpoint_every",
           c.train.resume);
    check_resume_step(c, std::get<std::int64_t>(it->second), c.train.resume);
  }
  if (sharded && optimizer_state)
    fail("train.resume = '{}' holds optimizer state, which cannot be resumed with parallel.zero = {} yet; resume with "
         "parallel.zero = none, or from a weights file (train.save)",
         c.train.resume, c.parallel.zero);
}

}  // namespace lmscale::io::detail
