// Sharded training checkpoints (include/lmscale/jobs/sharded_checkpointing.h, docs/checkpoints.md).
#include "lmscale/jobs/sharded_checkpointing.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <mpi.h>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/mpi_environment.h"
#include "lmscale/core/error.h"
#include "lmscale/core/host_vector.h"
#include "lmscale/io/sharded_checkpoint.h"
#include "lmscale/jobs/rank_agreement.h"
#include "lmscale/jobs/trainer_state.h"
#include "lmscale/ops/ops.h"

namespace lmscale::jobs {

namespace fs = std::filesystem;

namespace {

// Host staging in pieces of at most 16 Mi floats (64 MiB): a rank's shard of a large model never
// needs a host copy of its whole size.
constexpr std::int64_t kStage = std::int64_t{1} << 24;
constexpr io::StateKind kKinds[] = {io::StateKind::master, io::StateKind::m, io::StateKind::v};

const Tensor& view_of(const parallel::StatePiece& p, io::StateKind k) {
  return k == io::StateKind::master ? p.master : (k == io::StateKind::m ? p.m : p.v);
}

std::map<std::string, std::int64_t> model_dims(const Config& c) {
  return {{"vocab_size", c.model.vocab_size}, {"d_model", c.model.d_model}, {"d_ff", c.model.d_ff},
          {"num_layers", c.model.num_layers}, {"num_heads", c.model.num_heads}};
}

}  // namespace

void save_sharded_checkpoint(JobEnv& env, Trainer& trainer) {
  const Config& cfg = env.cfg;
  Context& ctx = env.rt.ctx();
  const std::string dir = io::checkpoint_step_dir(cfg.train.checkpoint_dir, trainer.step());
  LMSCALE_CHECK(trainer.params().master_dtype() == DType::f32, "sharded checkpoints hold fp32 master weights");
  // An earlier attempt at this step (a run that stopped while writing, or the same step written by
  // a run resumed from before it) is replaced: its index goes first, so it is never complete.
  agree_on_failure(env, [&] {
    if (!env.is_root()) return;
    std::error_code ec;
    fs::remove(fs::path(dir) / io::kIndexFile, ec);
    fs::remove_all(dir, ec);
    if (ec) throw Error(fmt::format("cannot remove the earlier incomplete checkpoint '{}': {}", dir, ec.message()));
    fs::create_directories(dir, ec);
    if (ec) throw Error(fmt::format("cannot create the checkpoint directory '{}': {}", dir, ec.message()));
  }, false);
  env.rt.synchronize();
  agree_on_failure(env, [&] {
    const parallel::StateLayout layout = describe_state(trainer, env.rank, env.world);
    std::int64_t total = 0;
    std::vector<io::ShardPiece> table;
    for (const auto& p : layout.save) {
      table.push_back({trainer.params().infos()[static_cast<std::size_t>(p.param)].name, p.begin, p.end, total});
      total += p.end - p.begin;
    }
    io::ShardWriter writer((fs::path(dir) / io::shard_file_name(env.rank)).string(), total);
    auto stage = host_vector<float>(static_cast<std::size_t>(std::min(kStage, std::max<std::int64_t>(total, 1))),
                                    "checkpoint staging buffer");
    for (std::size_t i = 0; i < layout.save.size(); ++i) {
      const auto& p = layout.save[i];
      for (io::StateKind k : kKinds) {
        const Tensor& src = view_of(p, k);
        // v of a one-state optimizer (sgd, lars): not held, written as zeros.
        const bool absent = k == io::StateKind::v && !src.defined();
        LMSCALE_CHECK(absent || src.numel() == p.end - p.begin, "checkpoint piece of {} elements has a view of {}",
                      p.end - p.begin, src.numel());
        for (std::int64_t at = 0; at < p.end - p.begin; at += kStage) {
          const std::int64_t n = std::min(kStage, p.end - p.begin - at);
          Tensor dst = Tensor::view(stage.data(), {n}, DType::f32, Device::cpu);
          if (absent) {
            std::fill(stage.begin(), stage.begin() + n, 0.0f);
          } else {
            ops::copy(ctx, src.flat_range(at, n), dst);
          }
          env.rt.synchronize();
          writer.write(k, table[i].offset + at, stage.data(), n);
        }
      }
    }
    writer.commit(table, {{"rank", static_cast<std::int64_t>(env.rank)},
                          {"world_size", static_cast<std::int64_t>(env.world)},
                          {"step", trainer.step()}});
  }, false);
  // Every rank file is complete: the index makes the checkpoint so.
  agree_on_failure(env, [&] {
    if (!env.is_root()) return;
    std::vector<std::pair<std::string, std::int64_t>> params;
    for (const auto& p : trainer.params().infos()) params.emplace_back(p.name, p.numel);
    std::map<std::string, io::AttrValue> attrs{
        {"step", trainer.step()},
        {"data_step", trainer.step()},   // samples are a pure function of (seed, step, index)
        {"optimizer_steps", optimizer_steps(trainer)},
        {"optimizer", cfg.optim.name},
        {"loss_scale", trainer.loss_scaler().scale()},
        {"loss_scale_clean_steps", trainer.loss_scaler().clean_steps()},
        {"seed", static_cast<std::int64_t>(cfg.run.seed)},
        {"rng", std::string("counter-based (splitmix64 of seed, key, index): state = seed and data_step")},
        {"writer_world_size", static_cast<std::int64_t>(env.world)},
        {"writer_layout", layout_name(trainer, cfg, env.world)},
        {"context_length", cfg.model.context_length},
        {"config", cfg.resolved},
    };
    for (const auto& [k, v] : model_dims(cfg)) attrs[k] = v;
    io::write_index(dir, env.world, params, attrs);
    io::prune_checkpoints(cfg.train.checkpoint_dir, cfg.train.keep_checkpoints);
  }, false);
}

std::optional<std::string> resume_directory(JobEnv& env) {
  const Config& cfg = env.cfg;
  std::string found;
  if (env.is_root()) {
    if (cfg.train.resume == "auto") {
      const auto complete = io::complete_checkpoints(cfg.train.checkpoint_dir);
      if (!complete.empty()) found = complete.back().second;
    } else if (std::error_code ec; !cfg.train.resume.empty() && fs::is_directory(cfg.train.resume, ec)) {
      found = cfg.train.resume;
    }
  }
  if (env.world > 1) {
    int n = static_cast<int>(found.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, env.mpi.world());
    found.resize(static_cast<std::size_t>(n));
    MPI_Bcast(found.data(), n, MPI_CHAR, 0, env.mpi.world());
  }
  if (found.empty()) return std::nullopt;
  return found;
}

namespace {

// Reads the checkpoint into the trainer (every rank its own pieces); throws on any problem.
void restore(JobEnv& env, Trainer& trainer, const std::string& step_dir) {
  const Config& cfg = env.cfg;
  Context& ctx = env.rt.ctx();
  const io::CheckpointIndex ix = io::read_index(step_dir);
  const std::string index_path = (fs::path(step_dir) / io::kIndexFile).string();
  if (const auto problem = io::model_mismatch(ix, model_dims(cfg)))
    throw UsageError(fmt::format("train.resume: checkpoint '{}' does not fit the deck: {}", index_path, *problem));
  if (ix.int_attr("seed") != static_cast<std::int64_t>(cfg.run.seed))
    throw UsageError(fmt::format("train.resume: checkpoint '{}' was written with run.seed = {} but the deck has {}; "
                                 "the data and random streams continue only with the same seed",
                                 index_path, ix.int_attr("seed"), cfg.run.seed));
  // Checkpoints from before issue 16 carry no optimizer name: they are AdamW's.
  std::string written_by = "adamw";
  if (auto it = ix.attrs.find("optimizer"); it != ix.attrs.end() && std::holds_alternative<std::string>(it->second))
    written_by = std::get<std::string>(it->second);
  if (written_by != cfg.optim.name)
    throw UsageError(fmt::format("train.resume: checkpoint '{}' holds the state of optim.name = {} but the deck asks "
                                 "for {}; set optim.name = {} (optimizer state belongs to the optimizer that wrote it)",
                                 index_path, written_by, cfg.optim.name, written_by));
  const auto& infos = trainer.params().infos();
  std::vector<int> saved_index(infos.size());
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const int j = ix.param_index(infos[i].name);
    if (j < 0 || ix.numels[static_cast<std::size_t>(j)] != infos[i].numel)
      throw UsageError(fmt::format("train.resume: checkpoint '{}' {} parameter '{}' ({} elements)", index_path,
                                   j < 0 ? "lacks" : "has another size for", infos[i].name, infos[i].numel));
    saved_index[i] = j;
  }
  std::map<int, io::ShardReader> readers;
  auto reader = [&](int file) -> const io::ShardReader& {
    auto it = readers.find(file);
    if (it == readers.end())
      it = readers.emplace(file, io::ShardReader((fs::path(step_dir) / ix.files[static_cast<std::size_t>(file)]).string()))
               .first;
    return it->second;
  };
  std::vector<float> stage;
  const parallel::StateLayout layout = describe_state(trainer, env.rank, env.world);
  for (const auto& p : layout.load) {
    const int j = saved_index[static_cast<std::size_t>(p.param)];
    for (const auto& e : ix.entries) {
      if (e.param != j || e.end <= p.begin || e.begin >= p.end) continue;
      const std::int64_t a = std::max(p.begin, e.begin), b = std::min(p.end, e.end);
      for (io::StateKind k : kKinds) {
        const Tensor& dst = view_of(p, k);
        if (!dst.defined()) continue;   // the rank holds no such state for this range
        for (std::int64_t at = a; at < b; at += kStage) {
          const std::int64_t n = std::min(kStage, b - at);
          stage.resize(static_cast<std::size_t>(n));
          reader(e.file).read(k, e.offset + (at - e.begin), stage.data(), n);
          Tensor src = Tensor::view(stage.data(), {n}, DType::f32, Device::cpu);
          Tensor out = dst.flat_range(at - p.begin, n);
          ops::copy(ctx, src, out);
          env.rt.synchronize();
        }
      }
    }
  }
  trainer.set_step(ix.int_attr("step"));
  set_optimizer_steps(trainer, ix.int_attr("optimizer_steps"));
  trainer.loss_scaler().set_scale(ix.double_attr("loss_scale"));
  trainer.loss_scaler().set_clean_steps(ix.int_attr("loss_scale_clean_steps"));
  if (trainer.params().has_flat_params() && trainer.params().has_lowp()) trainer.params().refresh_lowp(ctx);
}

}  // namespace

void load_sharded_checkpoint(JobEnv& env, Trainer& trainer, const std::string& step_dir) {
  // Every failure here means the checkpoint cannot continue this deck: exit 2, on every rank.
  agree_on_failure(env, [&] {
    try {
      restore(env, trainer, step_dir);
    } catch (const Error& e) {   // io: a damaged, truncated or unreadable file (named in the message)
      throw UsageError(fmt::format("train.resume: cannot read checkpoint '{}': {}", step_dir, e.what()));
    }
  }, true);
}

}  // namespace lmscale::jobs
