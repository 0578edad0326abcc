// Sharded training checkpoints (include/lmscale/jobs/engine/sharded_checkpointing.h, docs/checkpoints.md).
#include "lmscale/jobs/engine/sharded_checkpointing.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <string>
#include <utility>
#include <filesystem>
#include <functional>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include "lmscale/comm/communicator.h"
#include "lmscale/comm/mpi_environment.h"
#include "lmscale/core/error.h"
#include "lmscale/core/host_vector.h"
#include "lmscale/io/sharded_checkpoint.h"
#include "lmscale/jobs/engine/fp8_checkpoint_state.h"
#include "lmscale/jobs/resilience/rank_agreement.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/parallel/spec.h"
#include "lmscale/parallel/strategy.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/ops/ops.h"

namespace lmscale::jobs {

namespace fs = std::filesystem;

namespace {

// What this rank holds and writes, in the full model's coordinates (parallel/state_layout.h),
// after any update left in flight has finished.
parallel::StateLayout state_of(Trainer& trainer) {
  trainer.settle_optimizer();
  return trainer.strategy().state_layout();
}


// Host staging in pieces of at most 16 Mi floats (64 MiB): a rank's shard of a large model never
// needs a host copy of its whole size.
constexpr std::int64_t kStage = std::int64_t{1} << 24;
constexpr io::StateKind kKinds[] = {io::StateKind::master, io::StateKind::m, io::StateKind::v};

const Tensor& view_of(const parallel::StatePiece& p, io::StateKind k) {
  return k == io::StateKind::master ? p.master : (k == io::StateKind::m ? p.m : p.v);
}

// One copy between a device view and a rank file's array, and runs of them merged: a tensor-
// parallel row-parallel slice is one piece per row, contiguous both in memory and in the file,
// which must not cost one device copy, one synchronisation and one HDF5 call per row.
struct CopyRun {
  int file = 0;                      // restore: which rank file
  io::StateKind kind = io::StateKind::master;
  std::int64_t file_offset = 0;      // in the rank file's array
  float* device = nullptr;           // the view's first element (any device); save: null = zeros
  Device where = Device::cpu;
  std::int64_t count = 0;
};

void append_run(std::vector<CopyRun>& runs, const CopyRun& r) {
  if (r.count == 0) return;
  if (!runs.empty()) {
    CopyRun& b = runs.back();
    const bool adjacent = (b.device == nullptr && r.device == nullptr) ||
                          (b.device != nullptr && r.device != nullptr && b.device + b.count == r.device);
    if (b.file == r.file && b.kind == r.kind && b.where == r.where && b.file_offset + b.count == r.file_offset &&
        adjacent) {
      b.count += r.count;
      return;
    }
  }
  runs.push_back(r);
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
  const auto full_layout = model::parameter_layout(trainer.dims());
  agree_on_failure(env, [&] {
    const parallel::StateLayout layout = state_of(trainer);
    std::int64_t total = 0;
    std::vector<io::ShardPiece> table;
    std::vector<CopyRun> runs;
    for (io::StateKind k : kKinds) {
      std::int64_t at = 0;
      for (const auto& p : layout.save) {
        const Tensor& src = view_of(p, k);
        // v of a one-state optimizer (sgd, lars): not held, written as zeros (a run with no device).
        const bool absent = k == io::StateKind::v && !src.defined();
        LMSCALE_CHECK(absent || src.numel() == p.end - p.begin, "checkpoint piece of {} elements has a view of {}",
                      p.end - p.begin, src.numel());
        append_run(runs, {0, k, at, absent ? nullptr : src.data_as<float>(), absent ? Device::cpu : src.device(),
                          p.end - p.begin});
        at += p.end - p.begin;
      }
    }
    for (const auto& p : layout.save) {
      table.push_back({full_layout[static_cast<std::size_t>(p.param)].name, p.begin, p.end, total});
      total += p.end - p.begin;
    }
    io::ShardWriter writer((fs::path(dir) / io::shard_file_name(env.rank)).string(), total);
    auto stage = host_vector<float>(static_cast<std::size_t>(std::min(kStage, std::max<std::int64_t>(total, 1))),
                                    "checkpoint staging buffer");
    for (const auto& r : runs) {
      for (std::int64_t at = 0; at < r.count; at += kStage) {
        const std::int64_t n = std::min(kStage, r.count - at);
        if (r.device == nullptr) {
          std::fill(stage.begin(), stage.begin() + n, 0.0f);   // v of a one-state optimizer
        } else {
          Tensor src = Tensor::view(r.device + at, {n}, DType::f32, r.where);
          Tensor dst = Tensor::view(stage.data(), {n}, DType::f32, Device::cpu);
          ops::copy(ctx, src, dst);
          env.rt.synchronize();
        }
        writer.write(r.kind, r.file_offset + at, stage.data(), n);
      }
    }
    // Delayed FP8 scaling's state: this rank's own (each data-parallel rank scales its own rows).
    if (const auto st = capture_fp8_state(env, trainer)) {
      writer.write_state(kFp8HistoryName, {st->operands, st->history}, st->amax_history.data());
      writer.write_state(kFp8ScaleName, {st->operands}, st->scale.data());
      writer.write_state(kFp8InvScaleName, {st->operands}, st->inv_scale.data());
    }
    writer.commit(table, {{"rank", static_cast<std::int64_t>(env.rank)},
                          {"world_size", static_cast<std::int64_t>(env.world)},
                          {"step", trainer.step()}});
  }, false);
  // Every rank file is complete: the index makes the checkpoint so.
  agree_on_failure(env, [&] {
    if (!env.is_root()) return;
    // The full model's parameters (every layout's pieces are in its coordinates).
    std::vector<std::pair<std::string, std::int64_t>> params;
    for (const auto& p : full_layout) params.emplace_back(p.name, p.numel);
    std::map<std::string, io::AttrValue> attrs{
        {"step", trainer.step()},
        {"data_step", trainer.step()},   // samples are a pure function of (seed, step, index)
        {"optimizer_steps", trainer.strategy().optimizer_steps()},
        {"optimizer", to_string(cfg.optim.name)},
        {"loss_scale", trainer.loss_scaler().scale()},
        {"loss_scale_clean_steps", trainer.loss_scaler().clean_steps()},
        {"seed", static_cast<std::int64_t>(cfg.run.seed)},
        {"rng", std::string("counter-based (splitmix64 of seed, key, index): state = seed and data_step")},
        {"writer_world_size", static_cast<std::int64_t>(env.world)},
        {"writer_layout", parallel::Spec::resolve(cfg.parallel, env.world).describe(env.world)},
        {"context_length", cfg.model.context_length},
        {"config", cfg.resolved},
    };
    for (const auto& [k, v] : model_dims(cfg)) attrs[k] = v;
    io::write_index(dir, env.world, params, attrs);
    io::prune_checkpoints(cfg.train.checkpoint_dir, cfg.train.keep_checkpoints);
  }, false);
}

void move_aside_newer_checkpoints(JobEnv& env, std::int64_t step) {
  const auto& t = env.cfg.train;
  if (t.on_newer_checkpoints != NewerCheckpoints::move_aside || t.checkpoint_dir.empty() || t.resume.empty() ||
      t.resume == "auto")
    return;
  agree_on_failure(env, [&] {
    if (!env.is_root()) return;
    const io::MovedAside moved = io::move_aside_newer_checkpoints(t.checkpoint_dir, step);
    if (moved.names.empty()) return;
    fmt::print("train.on_newer_checkpoints = move-aside: moved {} checkpoint folder{} newer than step {} ({}) into "
               "'{}'\n",
               moved.names.size(), moved.names.size() == 1 ? "" : "s", step, fmt::join(moved.names, ", "),
               moved.folder);
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

// A shard file must be the one its index names: written by rank `file` of the index's writer world
// at the index's step (swapped or copied shards were accepted before issue 36).
void check_shard(const io::CheckpointIndex& ix, int file, const io::ShardReader& shard) {
  const auto get = [&](const char* name) -> std::optional<std::int64_t> {
    const auto it = shard.attrs().find(name);
    if (it == shard.attrs().end() || !std::holds_alternative<std::int64_t>(it->second)) return std::nullopt;
    return std::get<std::int64_t>(it->second);
  };
  const std::pair<const char*, std::int64_t> expected[] = {
      {"rank", file}, {"world_size", ix.int_attr("writer_world_size")}, {"step", ix.int_attr("step")}};
  for (const auto& [name, want] : expected) {
    const auto got = get(name);
    if (!got || *got != want)
      throw UsageError(fmt::format("train.resume: checkpoint file '{}' has {} = {} but its index '{}/{}' expects {}: "
                                   "the shard was swapped or copied from another checkpoint; resume a complete, "
                                   "unaltered checkpoint",
                                   shard.path(), name, got ? std::to_string(*got) : std::string("(missing)"), ix.dir,
                                   io::kIndexFile, want));
  }
  // Its layout: the file's own piece table must be the index's pieces of this file, piece for
  // piece (a shard of another layout, or an edited table, would put elements in wrong places).
  std::vector<io::ShardPiece> indexed;
  for (const auto& e : ix.entries)
    if (e.file == file) indexed.push_back({ix.params[static_cast<std::size_t>(e.param)], e.begin, e.end, e.offset});
  std::vector<io::ShardPiece> own = shard.pieces();
  const auto order = [](const io::ShardPiece& a, const io::ShardPiece& b) {
    return std::tie(a.name, a.begin, a.end, a.offset) < std::tie(b.name, b.begin, b.end, b.offset);
  };
  std::sort(indexed.begin(), indexed.end(), order);
  std::sort(own.begin(), own.end(), order);
  const auto same = [](const io::ShardPiece& a, const io::ShardPiece& b) {
    return a.name == b.name && a.begin == b.begin && a.end == b.end && a.offset == b.offset;
  };
  const auto [mine, theirs] = std::mismatch(own.begin(), own.end(), indexed.begin(), indexed.end(), same);
  if (mine != own.end() || theirs != indexed.end()) {
    const auto show = [](const io::ShardPiece& p) {
      return fmt::format("'{}' [{}, {}) at {}", p.name, p.begin, p.end, p.offset);
    };
    throw UsageError(fmt::format("train.resume: checkpoint file '{}' holds pieces other than its index '{}/{}' lists "
                                 "for it (the file has {}, the index {}): the shard belongs to another layout or was "
                                 "altered; resume a complete, unaltered checkpoint",
                                 shard.path(), ix.dir, io::kIndexFile, mine != own.end() ? show(*mine) : "nothing more",
                                 theirs != indexed.end() ? show(*theirs) : "nothing more"));
  }
}

// Delayed FP8 scaling's state of this rank from its own rank file, restored; or why it cannot be.
std::optional<std::string> restore_fp8(JobEnv& env, Trainer& trainer, const io::CheckpointIndex& ix,
                                       const std::function<const io::ShardReader&(int)>& reader) {
  const auto shape = fp8_state_shape(trainer);
  if (!shape) return std::nullopt;
  const auto [operands, H] = *shape;
  const std::int64_t writers = ix.int_attr("writer_world_size");
  const auto file = std::find(ix.files.begin(), ix.files.end(), io::shard_file_name(env.rank));
  if (writers != env.world || file == ix.files.end())
    return fp8_state_mismatch({writers, operands, H}, env.world, operands, H)
        .value_or(fmt::format("the checkpoint has no file of rank {}", env.rank));
  const io::ShardReader& r = reader(static_cast<int>(file - ix.files.begin()));
  const auto saved = r.state_shape(kFp8HistoryName);
  if (!saved) return fp8_state_absent();
  if (saved->size() != 2)
    throw Error(fmt::format("'{}' holds an FP8 amax history of {} dimensions, not 2 (operands, amaxes)", r.path(),
                            saved->size()));
  if (auto why = fp8_state_mismatch({writers, (*saved)[0], (*saved)[1]}, env.world, operands, H)) return why;
  Fp8ScalingState st{operands, H, std::vector<float>(static_cast<std::size_t>(operands * H)),
                     std::vector<float>(static_cast<std::size_t>(operands)),
                     std::vector<float>(static_cast<std::size_t>(operands))};
  r.read_state(kFp8HistoryName, {operands, H}, st.amax_history.data());
  r.read_state(kFp8ScaleName, {operands}, st.scale.data());
  r.read_state(kFp8InvScaleName, {operands}, st.inv_scale.data());
  check_fp8_state(st, r.path());
  restore_fp8_state(env, trainer, st);
  return std::nullopt;
}

// Reads the checkpoint into the trainer (every rank its own pieces); throws on any problem.
// Returns restore_fp8's answer.
std::optional<std::string> restore(JobEnv& env, Trainer& trainer, const std::string& step_dir) {
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
  if (written_by != name_of(cfg.optim.name))
    throw UsageError(fmt::format("train.resume: checkpoint '{}' holds the state of optim.name = {} but the deck asks "
                                 "for {}; set optim.name = {} (optimizer state belongs to the optimizer that wrote it)",
                                 index_path, written_by, cfg.optim.name, written_by));
  const auto infos = model::parameter_layout(trainer.dims());   // pieces are in full coordinates
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
    if (it == readers.end()) {
      it = readers.emplace(file, io::ShardReader((fs::path(step_dir) / ix.files[static_cast<std::size_t>(file)]).string()))
               .first;
      check_shard(ix, file, it->second);
    }
    return it->second;
  };
  // Every (file range -> view range) copy this rank needs, in order, merged into runs. The index's
  // entries are sorted by (param, begin) and disjoint: the first overlapping one is found by
  // bisection.
  const parallel::StateLayout layout = state_of(trainer);
  std::vector<CopyRun> runs;
  for (io::StateKind k : kKinds) {
    for (const auto& p : layout.load) {
      const Tensor& dst = view_of(p, k);
      if (!dst.defined()) continue;   // the rank holds no such state for this range
      const int j = saved_index[static_cast<std::size_t>(p.param)];
      auto e = std::partition_point(ix.entries.begin(), ix.entries.end(), [&](const io::CheckpointIndex::Entry& x) {
        return x.param < j || (x.param == j && x.end <= p.begin);
      });
      for (; e != ix.entries.end() && e->param == j && e->begin < p.end; ++e) {
        const std::int64_t a = std::max(p.begin, e->begin), b = std::min(p.end, e->end);
        append_run(runs, {e->file, k, e->offset + (a - e->begin), dst.data_as<float>() + (a - p.begin), dst.device(),
                          b - a});
      }
    }
  }
  std::vector<float> stage;
  for (const auto& r : runs) {
    for (std::int64_t at = 0; at < r.count; at += kStage) {
      const std::int64_t n = std::min(kStage, r.count - at);
      stage.resize(static_cast<std::size_t>(n));
      reader(r.file).read(r.kind, r.file_offset + at, stage.data(), n);
      // Master weights and optimizer state must be finite: a NaN would skip every step ("skipped:
      // overflow") for ever (issue 36).
      for (std::int64_t i = 0; i < n; ++i)
        if (!std::isfinite(stage[static_cast<std::size_t>(i)]))
          throw UsageError(fmt::format("train.resume: checkpoint file '{}' holds a non-finite value ({}) in '{}' at "
                                       "element {}; the state is damaged: resume an earlier checkpoint",
                                       reader(r.file).path(), stage[static_cast<std::size_t>(i)],
                                       io::state_kind_name(r.kind), r.file_offset + at + i));
      Tensor src = Tensor::view(stage.data(), {n}, DType::f32, Device::cpu);
      Tensor out = Tensor::view(r.device + at, {n}, DType::f32, r.where);
      ops::copy(ctx, src, out);
      env.rt.synchronize();
    }
  }
  trainer.set_step(ix.int_attr("step"));
  trainer.strategy().set_optimizer_steps(ix.int_attr("optimizer_steps"));
  trainer.loss_scaler().set_scale(ix.double_attr("loss_scale"));
  trainer.loss_scaler().set_clean_steps(ix.int_attr("loss_scale_clean_steps"));
  if (trainer.params().has_flat_params() && trainer.params().has_lowp()) trainer.params().refresh_lowp(ctx);
  trainer.weights_replaced();   // the FP8 weights the step casts are cast again (model/fp8_weight_casts.h)
  return restore_fp8(env, trainer, ix, reader);
}

}  // namespace

std::optional<std::string> load_sharded_checkpoint(JobEnv& env, Trainer& trainer, const std::string& step_dir) {
  // Every failure here means the checkpoint cannot continue this deck: exit 2, on every rank.
  std::optional<std::string> fp8_missing;
  agree_on_failure(env, [&] {
    try {
      fp8_missing = restore(env, trainer, step_dir);
    } catch (const Error& e) {   // io: a damaged, truncated or unreadable file (named in the message)
      throw UsageError(fmt::format("train.resume: cannot read checkpoint '{}': {}", step_dir, e.what()));
    }
  }, true);
  // Each rank reads its own file: rank 0 reports for all, so a rank without the state is counted.
  if (env.world > 1 && env.host_comm) {
    double missing = fp8_missing ? 1.0 : 0.0;
    env.host_comm->all_reduce(&missing, &missing, 1, DType::f64, comm::ReduceOp::sum).wait();
    if (missing > 0 && !fp8_missing)
      fp8_missing = fmt::format("{} of {} ranks found no usable FP8 scaling state in their files", missing, env.world);
  }
  return fp8_missing;
}

}  // namespace lmscale::jobs
