// validate(): cross-key checks of a deck (docs/architecture.md §6). Each failure is one UsageError that names
// the key(s) and says how to fix them, thrown before any work or output.
#include "deck_validate.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "deck_keys.h"
#include "lmscale/io/checkpoint.h"
#include "lmscale/io/dataset.h"
#include "lmscale/io/results_attr.h"
#include "lmscale/io/sharded_checkpoint.h"
#include "lmscale/io/text_data.h"
#include "lmscale/io/weights_format.h"
#include "output_target.h"
#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"

namespace lmscale::io {

namespace {

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw UsageError(fmt::format(format, std::forward<Args>(args)...));
}

bool runs_model(const Config& c) {
  return c.run.job == JobKind::train || c.run.job == JobKind::bench_model || c.run.job == JobKind::prune;
}
// Jobs that read training data: train, and prune's fine-tuning and evaluation.
bool trains(const Config& c) { return c.run.job == JobKind::train || c.run.job == JobKind::prune; }

// Head counts near `heads` that divide d_model with an even head dimension, for the fix hint.
std::string head_suggestions(std::int64_t d_model, std::int64_t heads, std::int64_t tp) {
  std::vector<std::int64_t> good;
  for (std::int64_t h = 1; h <= d_model; ++h)
    if (d_model % h == 0 && (d_model / h) % 2 == 0 && h % tp == 0) good.push_back(h);
  std::sort(good.begin(), good.end(), [heads](auto a, auto b) {
    const auto da = a > heads ? a - heads : heads - a, db = b > heads ? b - heads : heads - b;
    return da != db ? da < db : a < b;
  });
  if (good.size() > 3) good.resize(3);
  std::sort(good.begin(), good.end());
  return good.empty() ? std::string("none exists: change model.d_model") : fmt::format("e.g. {}", fmt::join(good, ", "));
}

void check_file(const std::string& key, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail("{} = '{}' is not an existing file (relative paths start at the working directory); fix the path", key, path);
}

void check_model(const Config& c) {
  const auto& m = c.model;
  if (m.d_model % m.num_heads != 0)
    fail("model.num_heads = {} does not divide model.d_model = {}; choose a divisor with an even head dimension ({})",
         m.num_heads, m.d_model, head_suggestions(m.d_model, m.num_heads, 1));
  if ((m.d_model / m.num_heads) % 2 != 0)
    fail("model.num_heads = {} gives an odd head dimension {} / {} = {}, but RoPE rotates pairs; choose model.num_heads "
         "with an even head dimension ({})",
         m.num_heads, m.d_model, m.num_heads, m.d_model / m.num_heads, head_suggestions(m.d_model, m.num_heads, 1));
}

void check_devices(const Config& c) {
  const auto& p = c.parallel;
  // The accounting job computes instead of running, so it may describe a GPU run from a CPU.
  // fp8 on the CPU is the exact emulation of its numerics (docs/precision.md), the one mixed mode
  // a CPU runs.
  if (p.device == DeviceChoice::cpu && c.precision.mode != PrecisionMode::fp32 &&
      c.precision.mode != PrecisionMode::fp8 && !predicts_only(c.run.job))
    fail("precision.mode = {} needs a CUDA device but parallel.device = cpu; set precision.mode = fp32 or "
         "parallel.device = cuda (or auto)",
         c.precision.mode);
  if (p.device == DeviceChoice::cpu && p.backend == BackendChoice::nccl)
    fail("parallel.backend = nccl needs CUDA devices but parallel.device = cpu; set parallel.backend = mpi (or auto)");
}

// Largest head dim of flash attention on CUDA (kMaxFlashHeadDim in src/ops/cuda/attention_kernels.h;
// io does not depend on ops). CPU flash takes any head dim.
constexpr std::int64_t kMaxCudaFlashHeadDim = 256;
#ifdef LMSCALE_WITH_CUDA
constexpr bool kCudaBuilt = true;
#else
constexpr bool kCudaBuilt = false;
#endif

// Refused here, before any allocation, whenever the run would be on CUDA: parallel.device = cuda,
// or auto in a CUDA build (auto picks the GPU wherever one is visible).
void check_flash_head_dim(const Config& c) {
  const auto& p = c.parallel;
  if (p.device != DeviceChoice::cuda && !(p.device == DeviceChoice::automatic && kCudaBuilt)) return;
  const auto& m = c.model;
  const std::int64_t head_dim = m.d_model / m.num_heads;
  if (runs_model(c) && m.attention == AttentionImpl::flash && head_dim > kMaxCudaFlashHeadDim) {
    std::int64_t heads = m.num_heads;   // the fewest heads at least as many that fit, for the hint
    while (heads <= m.d_model &&
           (m.d_model % heads || (m.d_model / heads) % 2 || m.d_model / heads > kMaxCudaFlashHeadDim || heads % p.tp))
      ++heads;
    fail("model.attention = flash on CUDA takes head dims up to {}, but the head dim is model.d_model / "
         "model.num_heads = {} / {} = {}; set model.attention = naive, model.num_heads = {}, or parallel.device = cpu",
         kMaxCudaFlashHeadDim, m.d_model, m.num_heads, head_dim, heads);
  }
  const auto& b = c.bench;
  if (c.run.job == JobKind::bench_attention && std::find(b.impls.begin(), b.impls.end(), AttentionImpl::flash) != b.impls.end())
    for (const std::int64_t d : b.head_dims)
      if (d > kMaxCudaFlashHeadDim)
        fail("bench.head_dims item {} exceeds {}, the largest head dim of flash attention on CUDA; drop it, remove "
             "flash from bench.impls, or set parallel.device = cpu",
             d, kMaxCudaFlashHeadDim);
}

void check_outputs(const Config& c) {
  if (c.run.output.empty()) fail("run.output is empty; set run.output = PATH.h5");
  if (weights_format(c.run.output) == WeightsFormat::safetensors)
    fail("run.output = '{}' names a safetensors file, but results files are HDF5; set run.output = PATH.h5",
         c.run.output);
  if (c.run.job == JobKind::train) {
    if (c.train.checkpoint_every > 0 && weights_format(c.train.checkpoint_path) == WeightsFormat::safetensors)
      fail("train.checkpoint_path = '{}' names a safetensors file, which holds weights only, not the optimizer state a "
           "checkpoint needs; set train.checkpoint_path = PATH.h5 (train.save may be .safetensors)",
           c.train.checkpoint_path);
    if (!c.train.save.empty() && c.train.save == c.run.output)
      fail("train.save = '{}' is also run.output; give the weights file a different path", c.train.save);
    if (c.train.checkpoint_every > 0 && c.train.checkpoint_path.empty())
      fail("train.checkpoint_every = {} needs train.checkpoint_path; set it or set train.checkpoint_every = 0",
           c.train.checkpoint_every);
    if (c.train.checkpoint_every > 0 && c.train.checkpoint_path == c.run.output)
      fail("train.checkpoint_path = '{}' is also run.output; give the checkpoint a different path", c.run.output);
    if (c.train.resume == "auto" && c.train.checkpoint_dir.empty())
      fail("train.resume = auto looks for checkpoints in train.checkpoint_dir, which is empty; set "
           "train.checkpoint_dir = DIR");
    std::error_code ec;
    if (!c.train.resume.empty() && c.train.resume != "auto" && !std::filesystem::is_directory(c.train.resume, ec))
      check_file("train.resume", c.train.resume);
    if (!c.train.checkpoint_dir.empty() && c.train.checkpoint_dir == c.run.output)
      fail("train.checkpoint_dir = '{}' is also run.output; give the checkpoints a directory of their own",
           c.run.output);
  }
}

// data.source = text: bytes are the tokens (ids 0..255).
void check_text_data(const Config& c) {
  if (c.data.path.empty())
    fail("data.source = text needs data.path; set data.path = FILE (a UTF-8 text file) or data.source = synthetic");
  if (c.model.vocab_size < 256)
    fail("data.source = text uses one token per byte (ids 0..255) but model.vocab_size = {}; set model.vocab_size = "
         "256",
         c.model.vocab_size);
}

void check_data(const Config& c) {
  if (c.data.source == DataSource::text) return check_text_data(c);
  if (c.data.source != DataSource::tokens) return;
  if (c.data.path.empty())
    fail("data.source = tokens needs data.path; set data.path = FILE (raw {} token ids) or data.source = synthetic",
         c.data.dtype);
  if (trains(c)) {
    check_file("data.path", c.data.path);
    if (!c.data.val_path.empty()) check_file("data.val_path", c.data.val_path);
  }
}

// The token files' length, element size and every id (one fast pass over each file): after the
// cheap checks, before any work.
void check_token_files(const Config& c) {
  if (c.data.source == DataSource::text && trains(c)) {
    const std::int64_t min_bytes = c.model.context_length + 2;
    const bool val_file = !c.data.val_path.empty() && c.data.val_path != c.data.path;
    check_text_file("data.path", c.data.path, val_file ? 0.0 : c.data.val_fraction, min_bytes);
    if (val_file) check_text_file("data.val_path", c.data.val_path, 0.0, min_bytes);
    return;
  }
  if (c.data.source != DataSource::tokens || !trains(c)) return;
  const std::int64_t min_tokens = c.model.context_length + 2;
  check_token_file("data.path", c.data.path, c.data.dtype, c.model.vocab_size, min_tokens);
  if (!c.data.val_path.empty() && c.data.val_path != c.data.path)
    check_token_file("data.val_path", c.data.val_path, c.data.dtype, c.model.vocab_size, min_tokens);
}

// run.job = prune: the weights file exists and fits the [model] keys (the shapes the model
// expects), the sparsity leaves something, the output is a path of its own.
void check_prune(const Config& c) {
  if (c.run.job != JobKind::prune) return;
  const auto& p = c.prune;
  const auto& m = c.model;
  if (p.weights.empty())
    fail("run.job = prune needs prune.weights = FILE (a weights file written by train.save, e.g. "
         "outputs/quickstart_weights.h5)");
  // Each round's smaller model must split its d_ff over tp ranks; not arranged (rounds would have
  // to keep multiples of tp units).
  if (p.method == PruneMethod::structured && c.parallel.tp > 1)
    fail("prune.method = structured with parallel.tp = {} is not built (the pruned d_ff would have to stay a multiple "
         "of tp); use parallel.tp = 1 or prune.method = unstructured",
         c.parallel.tp);
  check_file("prune.weights", p.weights);
  if (!p.output.empty() && (p.output == c.run.output || p.output == p.weights))
    fail("prune.output = '{}' is also {}; give the pruned weights a path of their own", p.output,
         p.output == c.run.output ? "run.output" : "prune.weights");
  if (p.method == PruneMethod::structured && m.d_ff - std::llround(p.target_sparsity * static_cast<double>(m.d_ff)) < 1)
    fail("prune.target_sparsity = {} removes every one of the {} FFN units (model.d_ff); choose a smaller sparsity",
         p.target_sparsity, m.d_ff);
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> expected{
      {"token_embeddings.weight", {m.vocab_size, m.d_model}},
      {"layers.0.attn.q_proj.weight", {m.d_model, m.d_model}},
      {fmt::format("layers.{}.ffn.w1.weight", m.num_layers - 1), {m.d_ff, m.d_model}},
      {"lm_head.weight", {m.vocab_size, m.d_model}}};
  try {
    const CheckpointReader r(p.weights);
    for (const auto& [name, shape] : expected) {
      if (!r.has(name))
        fail("prune.weights = '{}' has no parameter {}: it is not a weights file of this model (model.num_layers = "
             "{}?); give a file written by train.save with the same [model] keys",
             p.weights, name, m.num_layers);
      const auto got = r.shape(name);
      if (got != shape)
        fail("prune.weights = '{}': {} has shape [{}] but the [model] keys (vocab_size, d_model, d_ff) give [{}]; set "
             "the [model] keys of the run that wrote the file",
             p.weights, name, fmt::join(got, ", "), fmt::join(shape, ", "));
    }
    if (r.has(fmt::format("layers.{}.ln1.weight", m.num_layers)))
      fail("prune.weights = '{}' has more than model.num_layers = {} blocks; set model.num_layers to the file's",
           p.weights, m.num_layers);
    // Keys that change the function without changing a shape (num_heads, rope_theta; issue 36).
    if (const auto problem = detail::weights_mismatch(c, r))
      fail("prune.weights = '{}' does not fit the deck: {}; set the [model] keys of the run that wrote it", p.weights,
           *problem);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    fail("prune.weights = '{}' is not a readable weights file ({}); give a file written by train.save", p.weights,
         e.what());
  }
}

// [cost]: the accounting job's estimate needs an MFU; a bench file is read now (exit 2 if unusable).
void check_cost(const Config& c) {
  const auto& k = c.cost;
  if (c.run.job != JobKind::accounting || k.tokens <= 0) return;
  if (k.mfu <= 0 && k.mfu_from.empty())
    fail("cost.tokens = {} needs a model FLOPs utilisation: set cost.mfu (e.g. 0.4) or cost.mfu_from = BENCH.h5 (a "
         "bench-model results file)",
         k.tokens);
  if (k.mfu <= 0) {
    check_file("cost.mfu_from", k.mfu_from);
    read_bench_mfu("cost.mfu_from", k.mfu_from);
  }
}

void check_optim(const Config& c) {
  const auto& o = c.optim;
  if (o.min_lr > o.lr) fail("optim.min_lr = {} exceeds optim.lr = {}; set optim.min_lr <= optim.lr", o.min_lr, o.lr);
  if (c.run.job == JobKind::train && o.warmup_steps > c.train.steps)
    fail("optim.warmup_steps = {} exceeds train.steps = {}; set optim.warmup_steps <= train.steps", o.warmup_steps,
         c.train.steps);
  // Optimizer-specific keys (issue 16): a key that does nothing for the chosen optimizer, or an
  // impossible combination, is an error rather than silently ignored.
  if (o.nesterov && o.name != OptimizerName::sgd)
    fail("optim.nesterov = true with optim.name = {}: Nesterov momentum is built for sgd only; set optim.nesterov = "
         "false or optim.name = sgd",
         o.name);
  if (o.nesterov && o.momentum == 0)
    fail("optim.nesterov = true needs optim.momentum > 0 (it is 0); set optim.momentum, e.g. 0.9");
  if (o.name == OptimizerName::lars && !(o.trust_coefficient > 0 && o.trust_coefficient <= 1))
    fail("optim.trust_coefficient = {} for lars must lie in (0, 1] (the paper uses 0.001)", o.trust_coefficient);
  if (o.cosine_steps > 0 && o.cosine_steps < o.warmup_steps)
    fail("optim.cosine_steps = {} is less than optim.warmup_steps = {}; set optim.cosine_steps = 0 (= train.steps) "
         "or >= optim.warmup_steps",
         o.cosine_steps, o.warmup_steps);
}

// Sharding and checkpointing choices that contradict each other or the model.
void check_modes(const Config& c) {
  const auto& p = c.parallel;
  if (p.zero == ZeroLevel::fsdp && p.ddp != DdpKind::none)
    fail("parallel.ddp = {} with parallel.zero = fsdp: fsdp reduce-scatters its gradients itself; set parallel.ddp = "
         "none",
         p.ddp);
  const auto& t = c.train;
  if (t.activation_checkpointing == Checkpointing::every_k && t.checkpoint_k > c.model.num_layers)
    fail("train.checkpoint_k = {} exceeds model.num_layers = {}; choose a group size between 1 and {}", t.checkpoint_k,
         c.model.num_layers, c.model.num_layers);
  if (t.checkpoint_layers > 0 && t.activation_checkpointing != Checkpointing::every_k)
    fail("train.checkpoint_layers = {} with train.activation_checkpointing = {}: it limits the blocks every-k "
         "checkpoints; set train.activation_checkpointing = every-k or train.checkpoint_layers = 0",
         t.checkpoint_layers, t.activation_checkpointing);
  if (t.checkpoint_layers > c.model.num_layers)
    fail("train.checkpoint_layers = {} exceeds model.num_layers = {}; choose 0 (every block) to {}",
         t.checkpoint_layers, c.model.num_layers, c.model.num_layers);
  if (t.checkpoint_keep_attention && t.activation_checkpointing != Checkpointing::every_k)
    fail("train.checkpoint_keep_attention = true with train.activation_checkpointing = {}: it keeps the attention "
         "output of blocks whose forward every-k recomputes; set train.activation_checkpointing = every-k or "
         "train.checkpoint_keep_attention = false",
         t.activation_checkpointing);
}

void check_bench(const Config& c) {
  if (c.bench.min_bytes > c.bench.max_bytes)
    fail("bench.min_bytes = {} exceeds bench.max_bytes = {}; set bench.min_bytes <= bench.max_bytes", c.bench.min_bytes,
         c.bench.max_bytes);
}

// Pipeline keys against each other and the model (model/stage.h, parallel/pipeline.h).
void check_pipeline(const Config& c) {
  const auto& p = c.parallel;
  const auto& m = c.model;
  if (p.virtual_stages < 1) fail("parallel.virtual_stages = {} must be at least 1", p.virtual_stages);
  if (p.schedule == PipelineSchedule::interleaved) {
    if (m.num_layers % (p.pp * p.virtual_stages) != 0)
      fail("parallel.virtual_stages = {}: the interleaved schedule needs model.num_layers = {} divisible by "
           "parallel.pp * parallel.virtual_stages = {} * {}",
           p.virtual_stages, m.num_layers, p.pp, p.virtual_stages);
    if (p.pp > 1 && p.microbatches % p.pp != 0)
      fail("parallel.microbatches = {}: the interleaved schedule needs a multiple of parallel.pp = {}",
           p.microbatches, p.pp);
  } else if (p.virtual_stages != 1) {
    fail("parallel.virtual_stages = {} needs parallel.schedule = interleaved (schedule is {})", p.virtual_stages,
         p.schedule);
  }
  if (!p.stage_layers.empty()) {
    std::int64_t sum = 0;
    for (std::int64_t n : p.stage_layers) sum += n;
    if (static_cast<std::int64_t>(p.stage_layers.size()) != p.pp || sum != m.num_layers)
      fail("parallel.stage_layers = {} gives {} stages and {} layers; it needs parallel.pp = {} entries summing to "
           "model.num_layers = {}", fmt::join(p.stage_layers, ","), p.stage_layers.size(), sum, p.pp, m.num_layers);
    if (p.schedule == PipelineSchedule::interleaved)
      fail("parallel.stage_layers is not used by the interleaved schedule (its chunks are equal); leave it empty");
  }
  if (p.pp > 1 && p.zero == ZeroLevel::fsdp && p.schedule == PipelineSchedule::interleaved)
    fail("parallel.zero = fsdp with parallel.schedule = interleaved is not available: the memory model and the "
         "accounting do not predict fsdp over interleaved chunks; use parallel.schedule = gpipe or 1f1b with fsdp, or "
         "parallel.zero = none, zero1 or zero2 with the interleaved schedule");
  if (p.pp > 1 && p.zero == ZeroLevel::fsdp && p.schedule == PipelineSchedule::zb_h1)
    fail("parallel.zero = fsdp with parallel.schedule = zb-h1 is not available: fsdp reduce-scatters a unit's "
         "gradients after its backward, before zb-h1's deferred weight gradients; use parallel.schedule = 1f1b with "
         "fsdp, or parallel.zero = none, zero1 or zero2 with zb-h1");
  if (p.pp > 1 && p.zero == ZeroLevel::fsdp && p.tp > 1)
    fail("parallel.zero = fsdp with parallel.pp = {} and parallel.tp = {} is not available: fsdp pipeline stages are "
         "tested and predicted over dp only; set parallel.tp = 1 (fsdp over dp x pp), or use parallel.zero = zero1 or "
         "zero2 with tp x pp", p.pp, p.tp);
  if (p.pp > 1 && c.run.job == JobKind::train && c.train.grad_accum != 1)
    fail("train.grad_accum = {} with parallel.pp = {}: a pipeline accumulates over parallel.microbatches; set "
         "train.grad_accum = 1 and raise parallel.microbatches", c.train.grad_accum, p.pp);
}

// parallel.offload = optimizer and optimizer+params: what is built (docs/parallel.md, "CPU offload").
void check_offload(const Config& c, std::int64_t dp) {
  const auto& p = c.parallel;
  if (p.offload_delayed_update && p.offload != OffloadMode::optimizer_params)
    fail("parallel.offload_delayed_update = true lets the forward read parameters one host update old, which is "
         "built for parallel.offload = optimizer+params (fsdp) only (parallel.offload = {}); set parallel.offload = "
         "optimizer+params with parallel.zero = fsdp, or parallel.offload_delayed_update = false",
         p.offload);
  if (p.offload == OffloadMode::none) return;
  if (c.optim.name != OptimizerName::adamw)
    fail("parallel.offload = {} runs AdamW on the host; optim.name = {} has no host version; set optim.name = adamw "
         "or parallel.offload = none",
         p.offload, c.optim.name);
  if (p.offload == OffloadMode::optimizer_params && p.zero != ZeroLevel::fsdp)
    fail("parallel.offload = {} puts the parameter shards in host memory, which only parallel.zero = fsdp has "
         "(parallel.zero = {}); set parallel.zero = fsdp or parallel.offload = optimizer",
         p.offload, p.zero);
  if (p.zero == ZeroLevel::zero1_broadcast)
    fail("parallel.offload = {} is not built yet with parallel.zero = {}; use parallel.zero = zero1 or zero2, or "
         "parallel.offload = none",
         p.offload, p.zero);
  if (p.zero == ZeroLevel::none && dp > 1)
    fail("parallel.offload = {} is not built yet for DDP (parallel.zero = none with parallel.dp = {}); use "
         "parallel.zero = zero1 or zero2, or parallel.offload = none",
         p.offload, dp);
  if (p.tp > 1 || p.pp > 1)
    fail("parallel.offload = {} is not built yet with tensor or pipeline parallelism (parallel.tp = {}, parallel.pp = "
         "{}); set parallel.tp = parallel.pp = 1 or parallel.offload = none",
         p.offload, p.tp, p.pp);
  if (p.overlap_optimizer || p.overlap_param_gather)
    fail("parallel.offload = {} steps on the host after the backward; parallel.overlap_optimizer and "
         "parallel.overlap_param_gather are not built with it; set both to false or parallel.offload = none",
         p.offload);
}

// Parallel layout against the model, the batch and the world size. Batch checks come before the
// world-size check so that a deck is judged on its own first.
void check_layout(const Config& c, int world_size) {
  const auto& p = c.parallel;
  const auto& m = c.model;
  if (m.num_heads % p.tp != 0)
    fail("parallel.tp = {} does not divide model.num_heads = {}; choose parallel.tp among the divisors of {}", p.tp,
         m.num_heads, m.num_heads);
  if (m.d_ff % p.tp != 0)
    fail("parallel.tp = {} does not divide model.d_ff = {}; choose parallel.tp dividing both num_heads and d_ff", p.tp,
         m.d_ff);
  if (m.vocab_size % p.tp != 0)
    fail("parallel.tp = {} does not divide model.vocab_size = {} (the embedding and LM head are split by vocabulary "
         "rows); choose parallel.tp dividing num_heads, d_ff and vocab_size, or pad vocab_size to a multiple of {}",
         p.tp, m.vocab_size, p.tp);
  if (p.sequence_parallel && p.tp > 1 && m.context_length % p.tp != 0)
    fail("parallel.sequence_parallel = true needs model.context_length = {} divisible by parallel.tp = {} (each rank "
         "holds an equal sequence shard); change context_length or tp",
         m.context_length, p.tp);
  if (p.comm_sms > 0 && (p.device == DeviceChoice::cpu || p.backend == BackendChoice::mpi))
    fail("parallel.comm_sms = {} shares a GPU's SMs between NCCL and the GEMMs, but this run uses parallel.device = "
         "{} and parallel.backend = {}; set parallel.comm_sms = 0, or run on cuda with the nccl backend",
         p.comm_sms, p.device, p.backend);
  if (p.grad_exchange == GradExchange::copy_engine && runs_model(c)) {
    if (p.zero != ZeroLevel::zero2 && !(p.zero == ZeroLevel::none && p.ddp == DdpKind::bucketed))
      fail("parallel.grad_exchange = copy-engine is built for parallel.zero = zero2 and for bucketed DDP (parallel.zero "
           "= none with parallel.ddp = bucketed), not parallel.zero = {} with parallel.ddp = {}; set one of those or "
           "parallel.grad_exchange = nccl",
           p.zero, p.ddp);
    if (p.device == DeviceChoice::cpu || p.backend == BackendChoice::mpi)
      fail("parallel.grad_exchange = copy-engine moves gradients between GPUs with their copy engines, but this run "
           "uses parallel.device = {} and parallel.backend = {}; set parallel.grad_exchange = nccl, or run on cuda with "
           "the nccl backend",
           p.device, p.backend);
    if (p.grad_reduce_dtype != GradReduceDtype::fp32)
      fail("parallel.grad_exchange = copy-engine sums the fp32 gradients itself; parallel.grad_reduce_dtype = {} is "
           "not built with it; set parallel.grad_reduce_dtype = fp32",
           p.grad_reduce_dtype);
    if (p.tp > 1 || p.pp > 1)
      fail("parallel.grad_exchange = copy-engine is built for data parallelism alone (parallel.tp = {}, parallel.pp = "
           "{}); set parallel.grad_exchange = nccl or parallel.tp = parallel.pp = 1",
           p.tp, p.pp);
  }
  if (p.grad_reduce_dtype == GradReduceDtype::bf16 && runs_model(c)) {
    if (p.zero == ZeroLevel::zero1 || p.zero == ZeroLevel::zero1_broadcast || p.zero == ZeroLevel::fsdp)
      fail("parallel.grad_reduce_dtype = bf16 is built for ddp (flat, overlap, bucketed) and zero2, not parallel.zero = "
           "{}; use parallel.zero = zero2 or parallel.grad_reduce_dtype = fp32",
           p.zero);
    if (p.zero == ZeroLevel::none && p.ddp == DdpKind::naive)
      fail("parallel.grad_reduce_dtype = bf16 is not built for parallel.ddp = naive (one collective per parameter); "
           "use parallel.ddp = flat, overlap or bucketed");
  }
  if (p.pp > m.num_layers)
    fail("parallel.pp = {} exceeds model.num_layers = {}; each pipeline stage needs at least one layer", p.pp,
         m.num_layers);
  check_pipeline(c);
  if (p.offload != OffloadMode::none && c.run.job == JobKind::plan && p.zero != ZeroLevel::fsdp)
    fail("parallel.offload = {} with parallel.zero = {}: run.job = plan models the offloaded optimizer of fsdp only "
         "(the other modes' synchronous copies are not in the step model); set parallel.zero = fsdp, or "
         "parallel.offload = none",
         p.offload, p.zero);
  if (p.offload == OffloadMode::optimizer_params && c.run.job == JobKind::plan)
    fail("parallel.offload = {} with run.job = plan: the step model does not count the per-unit host-to-device "
         "copies of the parameter shards; set parallel.offload = optimizer or none",
         p.offload);
  if (!runs_model(c)) return;

  const std::int64_t dp = detail::resolved_dp(c, world_size);
  const bool train = c.run.job == JobKind::train || c.run.job == JobKind::prune;
  const std::string batch_key = train ? "train.batch_size" : "bench.batch_size";
  const std::int64_t batch = train ? c.train.batch_size : c.bench.batch_size;
  if (batch % dp != 0)
    fail("{} = {} is not divisible by parallel.dp = {}; make the global batch a multiple of {}", batch_key, batch, dp, dp);
  const std::int64_t local = batch / dp;
  const std::int64_t accum = train ? c.train.grad_accum : 1;
  if (local % accum != 0)
    fail("train.grad_accum = {} does not divide the per-rank batch {} / parallel.dp = {}; choose a divisor of {}",
         accum, batch_key, local, local);
  if (p.pp > 1 && (local / accum) % p.microbatches != 0)
    fail("parallel.microbatches = {} does not divide the per-rank batch of one pass ({}); choose a divisor of {}",
         p.microbatches, local / accum, local / accum);
  if (dp * p.tp * p.pp != world_size)
    fail("parallel.dp * parallel.tp * parallel.pp = {} * {} * {} = {} but the MPI world size is {}; set parallel.dp = 0 "
         "(auto) or launch {} ranks",
         dp, p.tp, p.pp, dp * p.tp * p.pp, world_size, dp * p.tp * p.pp);
  check_offload(c, dp);
}

}  // namespace

namespace detail {

std::int64_t resolved_dp(const Config& c, int world_size) {
  const auto& p = c.parallel;
  if (p.dp > 0) return p.dp;
  const std::int64_t tp_pp = p.tp * p.pp;
  if (world_size % tp_pp == 0) return world_size / tp_pp;
  if (runs_model(c))
    fail("parallel.tp * parallel.pp = {} * {} = {} does not divide the MPI world size {}; change parallel.tp or "
         "parallel.pp, or launch a multiple of {} ranks",
         p.tp, p.pp, tp_pp, world_size, tp_pp);
  return 1;
}

}  // namespace detail

void validate(const Config& c, int world_size) {
  if (world_size < 1) throw Error(fmt::format("validate: world size {} < 1", world_size));
  // Each key's own type, range and allowed values, by re-reading its printed value: this covers
  // configs built in code as well as parsed ones.
  Config scratch = c;
  for (const auto& key : detail::deck_keys()) key.set(scratch, key.get(c));
  check_model(c);
  check_devices(c);
  detail::check_cuda_graphs(c, world_size);   // before the job's own checks: the key is named first
  check_flash_head_dim(c);
  check_outputs(c);
  check_data(c);
  check_optim(c);
  check_cost(c);
  check_prune(c);
  check_bench(c);
  check_modes(c);
  detail::check_moe(c, world_size);   // before the layout: a refused MoE mode is named first
  detail::check_fp8(c, world_size);
  detail::check_bench_gemm(c);
  check_layout(c, world_size);
  // Last: a deck is judged on its own before the file system is.
  detail::check_checkpoints(c, world_size);
  detail::check_output_paths(c, world_size);
  check_token_files(c);
}

}  // namespace lmscale::io
