#pragma once
// The resolved configuration of a run: every deck key as a typed field, after the deck file,
// command-line overrides and presets are applied and the whole is validated (io/deck.h). Field
// names are the deck's key names; docs/deck.md lists each key's meaning.
//
// Every enumerated key is an enum class below, parsed once from its deck spelling in io/ (the key
// table, src/io/deck_keys.cpp). Code outside src/io switches on the enum and never compares a mode
// as a string (docs/architecture.md, "Deck values"). `name_of(value)` gives the deck spelling back
// for messages and output files, and fmt prints the enums by that spelling.
#include <array>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "lmscale/core/dtype.h"

namespace lmscale {

// The deck spelling of each value of an enumerated key, in the enum's declaration order.
// Specialised once per enum below; io/ parses with it, everything prints with it.
template <class E>
struct DeckSpelling;

#define LMSCALE_DECK_ENUM(E, ...)                                                  \
  template <>                                                                      \
  struct DeckSpelling<E> {                                                         \
    static constexpr std::string_view names[] = {__VA_ARGS__};                     \
    static constexpr std::size_t count = sizeof(names) / sizeof(names[0]);         \
  }

template <class E, class = void>
struct is_deck_enum : std::false_type {};
template <class E>
struct is_deck_enum<E, std::void_t<decltype(DeckSpelling<E>::names)>> : std::true_type {};

template <class E, std::enable_if_t<is_deck_enum<E>::value, int> = 0>
constexpr std::string_view name_of(E e) {
  const auto i = static_cast<std::size_t>(e);
  return i < DeckSpelling<E>::count ? DeckSpelling<E>::names[i] : std::string_view("?");
}

// The deck spelling as a std::string, for HDF5 attributes and table cells.
template <class E, std::enable_if_t<is_deck_enum<E>::value, int> = 0>
std::string to_string(E e) {
  return std::string(name_of(e));
}

template <class E, std::enable_if_t<is_deck_enum<E>::value, int> = 0>
std::ostream& operator<<(std::ostream& os, E e) {
  return os << name_of(e);
}

// run.job
enum class JobKind { bench_model, bench_attention, bench_collectives, train, accounting, prune, plan, calibrate, bench_gemm };
LMSCALE_DECK_ENUM(JobKind, "bench-model", "bench-attention", "bench-collectives", "train", "accounting", "prune", "plan",
                  "calibrate", "bench-gemm");
// Jobs that predict a run instead of running it (accounting, plan): they may describe a GPU run
// from a CPU and build no world communicator.
inline bool predicts_only(JobKind j) { return j == JobKind::accounting || j == JobKind::plan; }
// model.attention, bench.impls
enum class AttentionImpl { naive, flash };
LMSCALE_DECK_ENUM(AttentionImpl, "naive", "flash");
// How the MoE experts' matrix products run on CUDA (docs/moe.md): one GEMM per expert, one cuBLAS
// grouped GEMM per projection over all experts, or our own grouped GEMM for Hopper. CPUs always loop.
enum class MoeExpertGemm { loop, grouped, wgmma };
LMSCALE_DECK_ENUM(MoeExpertGemm, "loop", "grouped", "wgmma");
// precision.mode: fp32, or mixed precision with fp32 master weights and 16-bit compute; fp8 is
// bf16 with the blocks' dense linear layers in FP8 (docs/precision.md).
enum class PrecisionMode { fp32, bf16, fp16, fp8 };
LMSCALE_DECK_ENUM(PrecisionMode, "fp32", "bf16", "fp16", "fp8");
// Whether a run computes in 16 bits (a bf16/fp16 working copy of the weights, 16-bit
// activations): bf16, fp16, and fp8 on a GPU; fp8 on a CPU emulates the FP8 GEMMs around fp32
// compute (docs/precision.md).
inline bool computes_16bit(PrecisionMode m, bool cuda) {
  return m == PrecisionMode::bf16 || m == PrecisionMode::fp16 || (m == PrecisionMode::fp8 && cuda);
}
// precision.fp8_scaling: how each FP8 operand's scale is chosen (ops::Fp8Recipe).
enum class Fp8Scaling { current, delayed };
LMSCALE_DECK_ENUM(Fp8Scaling, "current", "delayed");
// precision.fp8_grad_format: the FP8 format of the output gradients dy.
enum class Fp8GradFormat { e5m2, e4m3 };
LMSCALE_DECK_ENUM(Fp8GradFormat, "e5m2", "e4m3");
// precision.fp8_fast_accum: which FP8 GEMMs run with Hopper's fast accumulation (cuBLASLt's
// CUBLASLT_MATMUL_DESC_FAST_ACCUM: the tensor cores' partial sums never promoted to fp32; faster,
// less accurate; docs/precision.md, "Error bounds"): none, the forward y = x w^T only (Transformer
// Engine's and torchao's recipe), or all three products of a linear layer.
enum class Fp8FastAccum { none, forward, all };
LMSCALE_DECK_ENUM(Fp8FastAccum, "none", "forward", "all");
// precision.fp8_weight_casts: where the FP8 GEMM weights are cast (docs/precision.md, "Weights
// cast by the optimizer step"): by the optimizer step, which keeps their codes between steps,
// where the layout allows it (parallel::step_casts_fp8_weights), else by each forward; or always
// by each forward.
enum class Fp8WeightCastSite { optimizer, forward };
LMSCALE_DECK_ENUM(Fp8WeightCastSite, "optimizer", "forward");
// bench.dtypes: element types of the attention and collective sweeps.
enum class FloatType { fp32, bf16, fp16 };
LMSCALE_DECK_ENUM(FloatType, "fp32", "bf16", "fp16");
inline DType dtype_of(FloatType t) {
  return t == FloatType::bf16 ? DType::bf16 : t == FloatType::fp16 ? DType::f16 : DType::f32;
}
// parallel.device
enum class DeviceChoice { automatic, cpu, cuda };
LMSCALE_DECK_ENUM(DeviceChoice, "auto", "cpu", "cuda");
// parallel.backend
enum class BackendChoice { automatic, mpi, nccl };
LMSCALE_DECK_ENUM(BackendChoice, "auto", "mpi", "nccl");
// parallel.ddp: how data-parallel gradients are all-reduced (none: flat when dp > 1).
enum class DdpKind { none, naive, flat, overlap, bucketed };
LMSCALE_DECK_ENUM(DdpKind, "none", "naive", "flat", "overlap", "bucketed");
// parallel.grad_reduce_dtype
enum class GradReduceDtype { fp32, bf16 };
LMSCALE_DECK_ENUM(GradReduceDtype, "fp32", "bf16");
// parallel.grad_exchange: the backend of zero2's and bucketed DDP's bucket sums.
enum class GradExchange { nccl, copy_engine };
LMSCALE_DECK_ENUM(GradExchange, "nccl", "copy-engine");
// parallel.ep_exchange: the backend of expert parallelism's row all-to-alls (docs/moe.md).
enum class EpExchange { nccl, copy_engine };
LMSCALE_DECK_ENUM(EpExchange, "nccl", "copy-engine");
// parallel.zero: what is sharded over the data-parallel ranks.
enum class ZeroLevel { none, zero1_broadcast, zero1, zero2, fsdp };
LMSCALE_DECK_ENUM(ZeroLevel, "none", "zero1-broadcast", "zero1", "zero2", "fsdp");
// parallel.offload: what lives in host memory instead of the device (docs/parallel.md).
// optimizer_params: fsdp only, the shard's 16-bit parameters on the host too.
enum class OffloadMode { none, optimizer, optimizer_params };
LMSCALE_DECK_ENUM(OffloadMode, "none", "optimizer", "optimizer+params");
// parallel.fsdp_gather_dtype: the element type of fsdp's weight all-gathers (docs/parallel.md).
// compute: the compute dtype (bf16 in mixed precision); fp8: precision.mode = fp8's block weights
// in e4m3 with a scale from the dp group's amax (parallel/fsdp_fp8_gather.h), the rest as compute.
enum class FsdpGatherDtype { compute, fp8 };
LMSCALE_DECK_ENUM(FsdpGatherDtype, "compute", "fp8");
// parallel.schedule: the pipeline schedule.
enum class PipelineSchedule { gpipe, one_f_one_b, interleaved, zb_h1 };
LMSCALE_DECK_ENUM(PipelineSchedule, "gpipe", "1f1b", "interleaved", "zb-h1");
// bench.mode: what one timed bench-model step does.
enum class BenchMode { forward, forward_backward, train_step };
LMSCALE_DECK_ENUM(BenchMode, "forward", "forward-backward", "train-step");
// bench.passes: what bench-attention times.
enum class AttentionPass { forward, backward, forward_backward };
LMSCALE_DECK_ENUM(AttentionPass, "forward", "backward", "forward-backward");
// bench.gemm_precisions: how bench-gemm runs each GEMM: fp32 or bf16 operands (ops::linear), or
// FP8 operands (ops::Fp8Linear, the layers of precision.mode = fp8).
enum class GemmPrecision { fp32, bf16, fp8 };
LMSCALE_DECK_ENUM(GemmPrecision, "fp32", "bf16", "fp8");
// bench.ops
enum class CollectiveOp { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all };
LMSCALE_DECK_ENUM(CollectiveOp, "all-reduce", "reduce-scatter", "all-gather", "broadcast", "all-to-all");
// bench.algo
enum class CollectiveAlgo { library, ring, shm, hier, automatic };
LMSCALE_DECK_ENUM(CollectiveAlgo, "library", "ring", "shm", "hier", "auto");
// bench.format: bench-collectives' stdout table (lmscale's, or nccl-tests' exact layout).
enum class BenchFormat { table, nccl_tests };
LMSCALE_DECK_ENUM(BenchFormat, "table", "nccl-tests");
// train.activation_checkpointing
enum class Checkpointing { none, every_k, selective, selective_mlp };
LMSCALE_DECK_ENUM(Checkpointing, "none", "every-k", "selective", "selective-mlp");
// train.on_newer_checkpoints: what a resume from an older step does with the newer checkpoints in
// train.checkpoint_dir (refuse: exit 2; move_aside: into checkpoint_dir/superseded-<time>/)
enum class NewerCheckpoints { refuse, move_aside };
LMSCALE_DECK_ENUM(NewerCheckpoints, "refuse", "move-aside");
// optim.name
enum class OptimizerName { adamw, sgd, lars, lamb };
LMSCALE_DECK_ENUM(OptimizerName, "adamw", "sgd", "lars", "lamb");
// data.source
enum class DataSource { synthetic, tokens, text };
LMSCALE_DECK_ENUM(DataSource, "synthetic", "tokens", "text");
// data.dtype: element type of token files.
enum class TokenDtype { uint16, uint32 };
LMSCALE_DECK_ENUM(TokenDtype, "uint16", "uint32");
inline std::size_t token_bytes(TokenDtype t) { return t == TokenDtype::uint32 ? 4 : 2; }
// prune.method
enum class PruneMethod { unstructured, structured };
LMSCALE_DECK_ENUM(PruneMethod, "unstructured", "structured");
// prune.schedule
enum class PruneSchedule { fixed, loss_guided };
LMSCALE_DECK_ENUM(PruneSchedule, "fixed", "loss-guided");

// accounting.device: the device the planned run uses, whose memory and peak rates the accounting
// reads (jobs/predict/target_device.h); auto = the GPU this process sees, else the deck's device.
enum class TargetDevice { automatic, h100_80gb, h200, cpu };
LMSCALE_DECK_ENUM(TargetDevice, "auto", "h100-80gb", "h200", "cpu");
// plan.cluster: a cluster description shipped with lmscale (docs/planner.md names each figure's
// source); the [cluster] keys override single figures.
enum class ClusterPreset { h100_nvlink_ib400, h200_nvlink_ib400 };
LMSCALE_DECK_ENUM(ClusterPreset, "h100-nvlink-ib400", "h200-nvlink-ib400");


#undef LMSCALE_DECK_ENUM

struct RunConfig {
  JobKind job = JobKind::train;
  std::string output = "outputs/run.h5"; // HDF5 results path
  std::uint64_t seed = 0;
  bool progress = true;                  // progress lines on stdout (rank 0)
  std::string trace;                     // Chrome-trace JSON path; empty: no trace (docs/profiling.md)
  std::string metrics;                   // JSON Lines metrics stream (rank 0); empty: none (docs/metrics.md)

  bool operator==(const RunConfig&) const = default;
};

struct ModelConfig {
  std::string size = "custom";           // preset name or "custom"
  std::int64_t vocab_size = 10000;
  std::int64_t context_length = 256;
  std::int64_t d_model = 512;
  std::int64_t d_ff = 1344;
  std::int64_t num_layers = 4;
  std::int64_t num_heads = 16;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  AttentionImpl attention = AttentionImpl::naive;
  bool attention_deterministic = false; // flash backward without atomics (bit-reproducible dQ)
  // Rows per chunk of the fused LM head + cross-entropy: -1 = auto (chunk logits <= 256 MiB),
  // 0 = all rows in one chunk, n >= 1 = n rows (model/model_dims.h head_chunk_rows).
  std::int64_t ce_chunk_rows = -1;
  // Mixture of experts (docs/moe.md): 0 experts = every block dense. With E > 0 the FFN of every
  // moe_every-th block (blocks moe_every-1, 2 moe_every-1, ...) is E SwiGLU experts of inner size
  // moe_expert_dff behind a top-k router; moe_capacity_factor 0 = dropless, else each expert takes
  // at most ceil(cf * tokens * k / E) tokens of a micro-batch.
  std::int64_t moe_experts = 0;
  std::int64_t moe_top_k = 2;
  std::int64_t moe_expert_dff = 0;       // 0 = model.d_ff
  std::int64_t moe_every = 1;
  double moe_capacity_factor = 0.0;
  double moe_aux_loss = 0.01;            // load-balancing loss coefficient
  double moe_z_loss = 0.001;             // router z-loss coefficient
  MoeExpertGemm moe_expert_gemm = MoeExpertGemm::loop;   // CUDA experts' GEMMs (CPU: ignored)

  bool operator==(const ModelConfig&) const = default;
};

struct PrecisionConfig {
  PrecisionMode mode = PrecisionMode::fp32;
  bool tf32 = false;
  bool gemm_autotune = false;           // CUDA: time cuBLASLt candidates per shape, keep the fastest
  double loss_scale_init = 65536.0;     // fp16 dynamic loss scaling
  std::int64_t loss_scale_window = 1000;// clean steps before the scale doubles
  Fp8Scaling fp8_scaling = Fp8Scaling::current;   // mode = fp8 only
  std::int64_t fp8_history = 16;        // delayed scaling's amax window (casts of each operand)
  std::int64_t fp8_margin = 0;          // scales divided by 2^margin
  Fp8GradFormat fp8_grad_format = Fp8GradFormat::e5m2;
  Fp8FastAccum fp8_fast_accum = Fp8FastAccum::forward;   // the peers' recipe (docs/precision.md)
  Fp8WeightCastSite fp8_weight_casts = Fp8WeightCastSite::optimizer;

  bool operator==(const PrecisionConfig&) const = default;
};

struct ParallelConfig {
  DeviceChoice device = DeviceChoice::automatic;
  BackendChoice backend = BackendChoice::automatic;
  std::int64_t dp = 0;                  // 0 = world size / (tp*pp)
  std::int64_t tp = 1, pp = 1;
  DdpKind ddp = DdpKind::none;
  double bucket_mb = 25.0;
  GradReduceDtype grad_reduce_dtype = GradReduceDtype::fp32;  // element type of the gradient collectives
  GradExchange grad_exchange = GradExchange::nccl;  // how zero2's and bucketed DDP's gradient buckets are reduced
  ZeroLevel zero = ZeroLevel::none;
  OffloadMode offload = OffloadMode::none;  // optimizer: fp32 master, m, v of the rank's range in host memory, AdamW on the host
  std::int64_t offload_threads = 0;         // host AdamW threads per rank; 0 = auto (optim::host_adamw_threads)
  bool offload_delayed_update = false;      // optimizer+params: the forward reads the update before the one in flight
  std::int64_t fsdp_prefetch = 1;       // fsdp: units gathered ahead of the one computing
  bool reshard_after_forward = true;    // fsdp: free gathered weights after each unit's forward
  std::int64_t microbatches = 1;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  std::int64_t virtual_stages = 1;      // interleaved: model chunks per pipeline rank
  std::vector<std::int64_t> stage_layers;   // blocks per stage (deck: 12,12,12,12); empty = balanced
  bool sequence_parallel = false;       // tp: norms and residuals on sequence shards
  std::int64_t timeout_s = 0;           // train, bench-model: a step (or checkpoint) taking longer aborts the job; 0 = off
  bool overlap_optimizer = false;       // CUDA, unsharded: optimizer on a side stream, overlapping the next forward (measured: no gain)
  bool overlap_param_gather = false;    // zero1/zero2: the parameters' all-gather after the step overlaps the next forward (measured: slower on 2 H200)
  std::int64_t comm_sms = 0;            // CUDA + NCCL: SMs left to NCCL (its maxCTAs), withheld from GEMMs that overlap it; 0 = off
  std::int64_t ep = 1;                  // expert parallelism: experts split over ep ranks inside dp (docs/moe.md)
  FsdpGatherDtype fsdp_gather_dtype = FsdpGatherDtype::compute;   // fsdp: what the weight all-gathers move
  EpExchange ep_exchange = EpExchange::nccl;   // ep > 1: how the MoE blocks' token rows cross the ep group
  std::int64_t ep_rebalance_every = 0;  // ep > 1: relabel the experts to even the ep ranks' rows every N steps; 0 = never

  bool operator==(const ParallelConfig&) const = default;
};

struct BenchConfig {
  // bench-model
  BenchMode mode = BenchMode::train_step;
  std::int64_t warmup = 5;
  std::int64_t steps = 10;
  std::int64_t batch_size = 4;          // global
  bool memory_timeline = false;
  // bench-attention sweep (lists)
  std::vector<AttentionImpl> impls{AttentionImpl::naive, AttentionImpl::flash};
  std::vector<AttentionPass> passes{AttentionPass::forward, AttentionPass::backward, AttentionPass::forward_backward};
  std::vector<std::int64_t> attn_batch{1};
  std::vector<std::int64_t> attn_heads{16};
  std::vector<std::int64_t> seq_lens{1024};
  std::vector<std::int64_t> head_dims{64};
  std::vector<FloatType> dtypes{FloatType::bf16};  // attention and collectives element types
  std::vector<bool> causal{true};
  // bench-gemm (with bench.batch_size, bench.warmup, bench.steps and the model's shape)
  std::vector<GemmPrecision> gemm_precisions{GemmPrecision::bf16, GemmPrecision::fp8};
  // bench-collectives sweep
  std::vector<CollectiveOp> ops{CollectiveOp::all_reduce};
  CollectiveAlgo algo = CollectiveAlgo::library;
  std::int64_t min_bytes = 1 << 20;
  std::int64_t max_bytes = 1 << 30;
  std::int64_t step_factor = 10;
  bool inplace = false;
  bool check = true;
  BenchFormat format = BenchFormat::table;   // bench-collectives' stdout layout

  bool operator==(const BenchConfig&) const = default;
};

struct TrainConfig {
  std::int64_t steps = 100;
  std::int64_t batch_size = 8;          // global
  std::int64_t grad_accum = 1;
  std::int64_t eval_every = 0;          // 0 = no evaluation
  std::int64_t eval_batches = 4;
  std::int64_t log_every = 10;
  std::string save;                     // final weights (HDF5), empty = none
  std::string resume;                   // checkpoint to resume from, empty = fresh start
  std::int64_t checkpoint_every = 0;    // 0 = none
  std::string checkpoint_path = "outputs/checkpoint.h5";
  Checkpointing activation_checkpointing = Checkpointing::none;
  std::int64_t checkpoint_k = 1;
  std::string checkpoint_dir;           // sharded checkpoints (step_NNNNNNNN/), empty = single-file checkpoint_path
  std::int64_t keep_checkpoints = 2;    // newest complete sharded checkpoints kept; 0 = all
  NewerCheckpoints on_newer_checkpoints = NewerCheckpoints::refuse;
  bool checkpoint_keep_attention = false;   // every-k: keep each block's attention output and LSE
  std::int64_t checkpoint_layers = 0;       // every-k: checkpoint only the first n blocks of a range (0: all)
  std::int64_t max_skipped_steps = 20;      // consecutive skipped/non-finite steps that stop the run; 0 = off
  bool cuda_graphs = false;                 // capture the train step once per shape, replay it (one GPU)

  bool operator==(const TrainConfig&) const = default;
};

struct OptimConfig {
  OptimizerName name = OptimizerName::adamw;
  double lr = 1e-3, min_lr = 1e-4;
  std::int64_t warmup_steps = 0;
  std::int64_t cosine_steps = 0;        // 0 = train.steps
  double weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double grad_clip = 1.0;               // global-norm clip; 0 = off
  double momentum = 0.9;                // sgd, lars
  bool nesterov = false;                // sgd
  double trust_coefficient = 0.001;     // lars: eta of the trust ratio
  std::int64_t reference_batch = 0;     // linear LR scaling: lr * global batch / reference_batch; 0 = off

  bool operator==(const OptimConfig&) const = default;
};

struct DataConfig {
  DataSource source = DataSource::synthetic;
  std::string path;                     // token file (raw little-endian uint16/uint32) or UTF-8 text file
  std::string val_path;                 // evaluation token file (default: path)
  TokenDtype dtype = TokenDtype::uint16;
  double val_fraction = 0.1;            // text: share of the file's tail held out for evaluation

  bool operator==(const DataConfig&) const = default;
};

// The machine the accounting job's communication analysis assumes (jobs/predict/parallel_bounds.h).
struct AccountingConfig {
  double device_tflops = 0;   // dense FLOP/s per device, TFLOP/s; 0 = datasheet peak (H100/H200)
  double link_gbps = 450;     // per-GPU link bandwidth, GB/s one way (NVLink 4: 900 both ways)
  std::int64_t world = 0;     // ranks of the planned run; 0 = dp x tp x pp if dp is set, else the launched ranks
  TargetDevice device = TargetDevice::automatic;   // the planned run's device

  bool operator==(const AccountingConfig&) const = default;
};

// The cost of a training run (accounting job) and of finishing the current one (train's ETA line);
// docs/recipes.md "Cost".
struct CostConfig {
  double tokens = 0;                    // tokens to train on; 0 = no cost estimate in accounting
  std::int64_t gpus = 0;                // 0 = the deck's layout (dp x tp x pp)
  double price_per_gpu_hour = 0;        // on-demand price per GPU-hour; 0 = no money figures
  double spot_discount = 0;             // fraction off the price (spot/preemptible), [0, 1)
  double mfu = 0;                       // model FLOPs utilisation; 0 = from mfu_from
  std::string mfu_from;                 // a bench-model results file: its /bench_model mfu
  double checkpoint_gbps = 2;           // checkpoint write bandwidth, GB/s (all writers together)
  double checkpoint_interval_h = 1;     // hours between checkpoints; 0 = none
  double preemptions_per_gpu_hour = 0;  // expected preemptions per GPU-hour
  double restart_minutes = 10;          // per preemption: new machines, load the checkpoint

  bool operator==(const CostConfig&) const = default;
};

// run.job = plan: predicted step time, memory and throughput of layouts of a deck on a cluster
// (docs/planner.md).
struct PlanConfig {
  std::int64_t gpus = 0;          // GPUs of the planned run; 0 = parallel.dp x tp x pp (dp 0 counts as 1)
  std::int64_t batch_size = 0;    // global batch in sequences; 0 = train.batch_size
  ClusterPreset cluster = ClusterPreset::h200_nvlink_ib400;
  std::string calibration;        // calibration file; empty = inputs/calibration/<h100|h200>.ini by plan.cluster
  bool search = true;             // rank every layout of plan.gpus, not only the deck's
  std::int64_t top = 10;          // layouts printed
  std::int64_t sweep_max_gpus = 4096;   // predicted tokens/s per layout family at 1, 2, 4, ... GPUs; 0 = none
  // MoE with parallel.ep > 1: the busiest ep rank's routed rows over the mean rank's (>= 1; 1 =
  // balanced routing). Every block's exchanges wait for its busiest rank, so the experts' products
  // and their all-to-alls on the critical path scale by it (bench-model records the measured value
  // as /bench_model moe_ep_rank_rows_max_over_mean).
  double moe_rank_imbalance = 1.0;

  bool operator==(const PlanConfig&) const = default;
};

// [cluster]: single figures of the plan.cluster preset; 0 = the preset's value.
struct ClusterConfig {
  std::int64_t gpus_per_node = 0;
  double bf16_tflops = 0, fp8_tflops = 0;   // dense peak per GPU
  double hbm_gbs = 0;                       // HBM bandwidth per GPU, GB/s
  double memory_gib = 0;                    // device memory per GPU as CUDA reports it
  double intra_gbs = 0, intra_us = 0;       // intra-node (NVLink) bus bandwidth per GPU and latency per step
  double inter_gbs = 0, inter_us = 0;       // inter-node (network) bandwidth per GPU and latency per step

  bool operator==(const ClusterConfig&) const = default;
};

// run.job = calibrate: measures this machine for the planner (docs/planner.md, "Calibration").
struct CalibrateConfig {
  std::string output = "outputs/calibration.ini";   // the calibration file written

  bool operator==(const CalibrateConfig&) const = default;
};

// run.job = prune: iterative global magnitude pruning of a weights file (docs/recipes.md "Pruning").
struct PruneConfig {
  std::string weights;                  // weights file to prune (train.save)
  PruneMethod method = PruneMethod::unstructured;  // L1 over all matrices, or L2 of FFN units
  PruneSchedule schedule = PruneSchedule::fixed;
  double target_sparsity = 0.9;         // fraction of the pruned parameters (units) removed at the end
  std::int64_t theta = 10;              // rounds that keep 1/10: gamma = 1 - (1/10)^(1/theta) per round
  std::int64_t finetune_steps = 20;     // training steps after each pruning round
  double max_loss = 0;                  // loss-guided: validation-loss bound; 0 = max_loss_increase
  double max_loss_increase = 0.05;      // loss-guided: bound = unpruned loss x (1 + this)
  std::string output;                   // pruned weights file; empty = none

  bool operator==(const PruneConfig&) const = default;
};

struct Config {
  RunConfig run;
  ModelConfig model;
  PrecisionConfig precision;
  ParallelConfig parallel;
  BenchConfig bench;
  TrainConfig train;
  OptimConfig optim;
  DataConfig data;
  AccountingConfig accounting;
  CostConfig cost;
  PruneConfig prune;
  PlanConfig plan;
  ClusterConfig cluster;
  CalibrateConfig calibrate;

  // Provenance, written to the HDF5 root attributes.
  std::string deck_path;      // "" when no deck file was given
  std::string deck_text;      // the deck file as given
  std::string command_line;   // argv joined
  std::string resolved;       // every key = value after resolution, INI format

  bool operator==(const Config&) const = default;
};

}  // namespace lmscale

// fmt prints every enumerated deck value by its deck spelling.
template <class E>
struct fmt::formatter<E, char, std::enable_if_t<lmscale::is_deck_enum<E>::value>> : fmt::formatter<std::string_view> {
  template <class FormatContext>
  auto format(E e, FormatContext& ctx) const {
    return fmt::formatter<std::string_view>::format(lmscale::name_of(e), ctx);
  }
};
