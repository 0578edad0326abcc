#include "deck_keys.h"

#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "deck_key_builders.h"
#include "deck_values.h"
#include "lmscale/core/error.h"
#include "lmscale/io/presets.h"

namespace lmscale::io::detail {

namespace {

// model.ce_chunk_rows: a row count, or the words auto (-1) and all (0).
DeckKey ce_chunk_rows_key() {
  const std::string name = "model.ce_chunk_rows";
  DeckKey k{name, "int|auto|all",
            "Rows per chunk of the fused LM head + cross-entropy (the [B*T, vocab] logits are never "
            "materialised: per chunk the logits, loss and gradient, then dx and dW_head): auto = as many rows as "
            "keep one chunk's logits <= 256 MiB (one chunk for small models: results as unchunked); all (or 0) = "
            "one chunk of every row; n = n rows.",
            {}, "auto, all, or an integer >= 0", {}, {}};
  k.set = [name](Config& c, const std::string& t) {
    std::string v = trim(t);
    for (auto& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (v == "auto") c.model.ce_chunk_rows = -1;
    else if (v == "all") c.model.ce_chunk_rows = 0;
    else if (!v.empty() && (std::isdigit(static_cast<unsigned char>(v[0])) || v[0] == '-' || v[0] == '+'))
      c.model.ce_chunk_rows = parse_int(name, t, 0);
    else
      throw UsageError(fmt::format("bad value for {}: '{}' (expected auto, all, or an integer >= 0)", name, trim(t)));
  };
  k.get = [](const Config& c) {
    const std::int64_t r = c.model.ce_chunk_rows;
    return r < 0 ? std::string("auto") : r == 0 ? std::string("all") : fmt::format("{}", r);
  };
  return k;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names{"custom"};
  for (const auto& p : model_presets()) names.push_back(p.name);
  return names;
}


std::vector<DeckKey> build_table() {
  using R = FloatRange;
  std::vector<DeckKey> table = {
      // [run]
      enum_key("run.job", LMSCALE_FIELD(run.job), "Job to run."),
      string_key("run.output", "path", LMSCALE_FIELD(run.output),
                 "HDF5 results file; written as PATH.tmp and renamed to PATH when the job ends."),
      string_key("run.trace", "path", LMSCALE_FIELD(run.trace),
                 "Chrome-trace JSON of the run, one file per rank (steps as ProfilerStep#N, phases, layers, "
                 "collectives, waits, sampled memory; distributedInfo for HTA): NAME.json gives NAME.rank{r}.json, "
                 "NAME.json.gz gives gzip-compressed NAME.rank{r}.json.gz. Open them in ui.perfetto.dev or Holistic "
                 "Trace Analysis (docs/profiling.md). Each is written as FILE.tmp and renamed when the job ends; "
                 "empty: no trace."),
      string_key("run.metrics", "path", LMSCALE_FIELD(run.metrics),
                 "JSON Lines metrics stream, written by rank 0 and flushed line by line so that it can be tailed or "
                 "imported into TensorBoard or W&B (docs/metrics.md): the resolved deck first, then one object per "
                 "logged train step (loss, lr, grad norm, tokens/s and TFLOP/s per GPU, MFU, memory, skipped), per "
                 "evaluation and per timed bench-model step. Replaces only a metrics file lmscale wrote (or an empty "
                 "file); empty: none."),
      uint_key("run.seed", LMSCALE_FIELD(run.seed), "Seed of every random stream (weight init, synthetic data, data order)."),
      bool_key("run.progress", LMSCALE_FIELD(run.progress), "Print progress lines on stdout (rank 0)."),
      // [model]
      choice_key("model.size", LMSCALE_FIELD(model.size), preset_names(),
               "Model size preset: fills d_model, d_ff, num_layers, num_heads, vocab_size and optim.beta2 "
               "(moe-1b also moe_experts, moe_top_k and moe_expert_dff) unless those keys are given explicitly."),
      int_key("model.vocab_size", LMSCALE_FIELD(model.vocab_size), 1, "Vocabulary size."),
      int_key("model.context_length", LMSCALE_FIELD(model.context_length), 1, "Sequence length of every batch (tokens)."),
      int_key("model.d_model", LMSCALE_FIELD(model.d_model), 1, "Hidden size."),
      int_key("model.d_ff", LMSCALE_FIELD(model.d_ff), 1, "Inner size of the SwiGLU feed-forward network."),
      int_key("model.num_layers", LMSCALE_FIELD(model.num_layers), 1, "Number of Transformer blocks."),
      int_key("model.num_heads", LMSCALE_FIELD(model.num_heads), 1,
              "Attention heads; must divide d_model with an even head dimension (RoPE)."),
      float_key("model.rope_theta", LMSCALE_FIELD(model.rope_theta), R::positive(), "RoPE base theta."),
      float_key("model.norm_eps", LMSCALE_FIELD(model.norm_eps), R::positive(), "RMSNorm epsilon."),
      enum_key("model.attention", LMSCALE_FIELD(model.attention),
               "Attention implementation: naive (materialises the score matrix) or flash (FlashAttention-2; "
               "on Hopper GPUs the FlashAttention-3 design at head dims 64 and 128)."),
      bool_key("model.attention_deterministic", LMSCALE_FIELD(model.attention_deterministic),
               "Flash backward without atomics, so dQ is bit-reproducible run to run: on CUDA the FlashAttention-2 "
               "two-kernel backward (7 products per tile pair instead of 5; slower). CPU flash is always "
               "deterministic."),
      ce_chunk_rows_key(),
      uint_key("model.moe_experts", LMSCALE_FIELD(model.moe_experts),
               "Mixture of experts (docs/moe.md): experts E per MoE block; 0 = every block dense."),
      int_key("model.moe_top_k", LMSCALE_FIELD(model.moe_top_k), 1,
              "Experts each token is routed to (top-k of the router's softmax, gates renormalised over the k; ties "
              "go to the lower expert index); at most moe_experts."),
      uint_key("model.moe_expert_dff", LMSCALE_FIELD(model.moe_expert_dff),
               "Inner size of each expert's SwiGLU; 0 = model.d_ff."),
      int_key("model.moe_every", LMSCALE_FIELD(model.moe_every), 1,
              "Which blocks are MoE: blocks moe_every-1, 2*moe_every-1, ... (1 = every block, 2 = every other block "
              "starting with the second); the others keep the dense FFN."),
      float_key("model.moe_capacity_factor", LMSCALE_FIELD(model.moe_capacity_factor), R::non_negative(),
                "0 = dropless; c > 0 = each expert takes at most ceil(c * tokens * top_k / experts) of a "
                "micro-batch's assignments, earlier tokens first; a dropped assignment adds nothing (the token "
                "keeps its residual)."),
      float_key("model.moe_aux_loss", LMSCALE_FIELD(model.moe_aux_loss), R::non_negative(),
                "Coefficient of the load-balancing loss (Switch/GShard form, per sequence; 1 at perfect balance)."),
      float_key("model.moe_z_loss", LMSCALE_FIELD(model.moe_z_loss), R::non_negative(),
                "Coefficient of the router z-loss (mean over tokens of logsumexp(router logits)^2)."),
      enum_key("model.moe_expert_gemm", LMSCALE_FIELD(model.moe_expert_gemm),
               "How the experts' matrix products run on CUDA (docs/moe.md): loop = one cuBLASLt GEMM per expert; "
               "grouped = one cuBLAS grouped GEMM per projection over all local experts (weight gradients into "
               "fp32 master gradients still loop: cuBLAS groups only same-dtype outputs); wgmma = lmscale's own grouped "
               "GEMM for Hopper, one persistent launch per projection, every product included (bf16/fp16 and an "
               "sm_90 GPU; elsewhere a loop on one stream). CPUs always loop."),
      // [precision]
      enum_key("precision.mode", LMSCALE_FIELD(precision.mode),
               "fp32, or bf16/fp16 mixed precision (fp32 master weights); bf16 and fp16 need a CUDA device. fp8: bf16 "
               "with the dense linear layers of each block (q, k, v, o, w1, w3, w2) in FP8 (docs/precision.md); "
               "needs a Hopper GPU (compute capability 9.x), or parallel.device = cpu for the exact CPU emulation."),
      bool_key("precision.tf32", LMSCALE_FIELD(precision.tf32), "Allow TF32 tensor cores for fp32 matrix products."),
      bool_key("precision.gemm_autotune", LMSCALE_FIELD(precision.gemm_autotune),
               "CUDA: time up to 8 cuBLASLt algorithms per matrix-product shape on first use and keep the fastest "
               "(5-15% faster bf16 GEMMs; the chosen algorithm, and so the last bits of results, may differ between "
               "runs). Off: the heuristic's first choice, deterministic."),
      float_key("precision.loss_scale_init", LMSCALE_FIELD(precision.loss_scale_init), R::positive(),
                "Initial dynamic loss scale (fp16)."),
      int_key("precision.loss_scale_window", LMSCALE_FIELD(precision.loss_scale_window), 1,
              "Steps without overflow before the fp16 loss scale doubles."),
      enum_key("precision.fp8_scaling", LMSCALE_FIELD(precision.fp8_scaling),
               "mode = fp8: current = each operand's scale from its amax now (two reads, never saturates); delayed "
               "= from the largest amax of its last fp8_history casts (one read; larger values saturate)."),
      int_key("precision.fp8_history", LMSCALE_FIELD(precision.fp8_history), 1,
              "mode = fp8, fp8_scaling = delayed: length of each operand's amax history, in casts."),
      int_key("precision.fp8_margin", LMSCALE_FIELD(precision.fp8_margin), 0,
              "mode = fp8: every FP8 scale is divided by 2^fp8_margin (headroom for delayed scaling)."),
      enum_key("precision.fp8_grad_format", LMSCALE_FIELD(precision.fp8_grad_format),
               "mode = fp8: FP8 format of the output gradients dy (e5m2: range; e4m3: precision). x and w are e4m3."),
      enum_key("precision.fp8_fast_accum", LMSCALE_FIELD(precision.fp8_fast_accum),
               "mode = fp8: which FP8 GEMMs use Hopper's fast accumulation (cuBLASLt FAST_ACCUM: partial sums kept "
               "in the tensor cores' reduced precision, never promoted to fp32; faster, less accurate, "
               "docs/precision.md): none; forward = y = x w^T only, dx and dW promoted (Transformer Engine's and "
               "torchao's recipe); all = the gradient products too. The CPU emulation ignores it."),
      enum_key("precision.fp8_weight_casts", LMSCALE_FIELD(precision.fp8_weight_casts),
               "mode = fp8: where the linear layers' weights are cast to FP8. optimizer = by the optimizer step, "
               "which keeps the codes and their transposes from one step to the next (delayed scaling on CUDA, "
               "one process or DDP with AdamW, without offload, overlap_optimizer or gradient accumulation, "
               "d_model and d_ff multiples of 64, a job that steps; elsewhere each forward casts, "
               "docs/precision.md); forward = each forward casts."),
      // [parallel]
      enum_key("parallel.device", LMSCALE_FIELD(parallel.device),
               "Where to compute: auto picks cuda when a GPU is visible, else cpu."),
      enum_key("parallel.backend", LMSCALE_FIELD(parallel.backend),
               "Collective backend: auto picks nccl on cuda, mpi on cpu."),
      int_key("parallel.dp", LMSCALE_FIELD(parallel.dp), 0,
              "Data-parallel degree; 0 = world size / (tp * pp). dp * tp * pp must equal the world size."),
      int_key("parallel.tp", LMSCALE_FIELD(parallel.tp), 1,
              "Tensor-parallel degree (Megatron: heads, d_ff and the vocabulary split over tp adjacent ranks); must "
              "divide num_heads, d_ff and vocab_size."),
      bool_key("parallel.sequence_parallel", LMSCALE_FIELD(parallel.sequence_parallel),
               "tp > 1: run the norms and residual adds on sequence shards (all-gather before the column-parallel "
               "matmuls, reduce-scatter after the row-parallel ones); context_length must be divisible by tp."),
      int_key("parallel.pp", LMSCALE_FIELD(parallel.pp), 1, "Pipeline-parallel degree (stages); at most num_layers."),
      int_key("parallel.ep", LMSCALE_FIELD(parallel.ep), 1,
              "Expert-parallel degree: the model.moe_experts experts of each MoE block split over ep ranks inside the "
              "data-parallel group (ep divides dp and moe_experts; tokens travel by all-to-all; expert gradients "
              "are summed over the dp/ep ranks that hold the same experts)."),
      enum_key("parallel.ep_exchange", LMSCALE_FIELD(parallel.ep_exchange),
               "parallel.ep > 1 on CUDA: how the MoE blocks' token rows (and their gradients) cross the expert-"
               "parallel group. nccl: NCCL's all-to-all. copy-engine: peer-to-peer copies into a receive window of "
               "each rank (CUDA IPC, one node, no SM moves a byte; device-side signals, no host wait); the same "
               "bits as nccl; costs (ep - 1) slots of one micro-batch's routed rows (tokens x moe_top_k x d_model "
               "in the compute dtype) of GPU memory per rank (docs/moe.md)."),
      int_key("parallel.ep_rebalance_every", LMSCALE_FIELD(parallel.ep_rebalance_every), 0,
              "parallel.ep > 1: after every N-th step, relabel each MoE block's experts so that the ep ranks' rows "
              "(routed since the last logged step or relabelling) even out, moving each expert's weights, router row and optimizer state with it "
              "(the same model; one all-to-all per moved parameter). bench-model does it in its "
              "warm-up steps only. 0 = never (docs/moe.md, \"Rebalancing the ep ranks\")."),
      enum_key("parallel.ddp", LMSCALE_FIELD(parallel.ddp), "Gradient all-reduce strategy of data parallelism."),
      float_key("parallel.bucket_mb", LMSCALE_FIELD(parallel.bucket_mb), R::positive(),
                "Bucket size of ddp = bucketed (MB)."),
      enum_key("parallel.grad_reduce_dtype", LMSCALE_FIELD(parallel.grad_reduce_dtype),
               "Element type of the data-parallel gradient collectives (ddp and zero2): bf16 halves the bytes; "
               "each rank's fp32 gradients are rounded to bf16, summed with fp32 accumulation (exact for 2 ranks; "
               "NCCL rounds to bf16 at each ring hop beyond that) and widened back to fp32."),
      enum_key("parallel.grad_exchange", LMSCALE_FIELD(parallel.grad_exchange),
               "zero2 and bucketed DDP on CUDA: how the gradient buckets are reduced. nccl: a reduce-scatter (zero2) "
               "or all-reduce (ddp) per bucket during the backward (NCCL's kernels hold SMs beside the GEMMs). "
               "copy-engine: peer-to-peer copies into a receive window of each rank (CUDA IPC, one node, no SM moves "
               "a byte; device-side signals, no host wait). zero2 sums each owned range by one add per bucket after "
               "the backward; bucketed DDP sums each rank's part of a bucket between the backward's kernels two "
               "buckets later and copies the sum back to every rank, during the backward. The same bits as nccl "
               "with 2 ranks; costs about (dp - 1) / dp x the fp32 gradient bytes of GPU memory "
               "(docs/parallel.md)."),
      enum_key("parallel.zero", LMSCALE_FIELD(parallel.zero),
               "Sharding of optimizer state, gradients and parameters over the dp ranks."),
      enum_key("parallel.offload", LMSCALE_FIELD(parallel.offload),
               "optimizer: the optimizer of what the rank owns lives in host memory and a multithreaded, vectorised "
               "AdamW updates it there. fsdp: the shard's fp32 master, m and v on the host, updated chunk by chunk "
               "while the next forward runs (the device keeps the gradient shard and a 16-bit copy); one process, "
               "zero1, zero2: the fp32 master, m and v of what the rank owns on the host, updated while the next "
               "forward runs (it waits for each unit's update; zero1/zero2 gather each unit as its update lands; "
               "bf16/fp16 keep no fp32 master on the device but for the norm weights). optimizer+params (fsdp "
               "only): the "
               "16-bit shard on the host too, copied to the device per unit before its all-gather (the device "
               "keeps the gradient shard only). The same results as none, bit for bit. optim.name = adamw; not "
               "with ddp, zero1-broadcast, tp or pp (docs/parallel.md)."),
      bool_key("parallel.offload_delayed_update", LMSCALE_FIELD(parallel.offload_delayed_update),
               "parallel.offload = optimizer+params: ZeRO-Offload's one-step-delayed update. The forward and "
               "backward of a step do not wait for the host update of the step before; they read the parameters "
               "of the step before that, so the whole host update runs beside the next step's forward and "
               "backward. Changes the numerics: each step's gradients are taken at parameters one update old. "
               "Host memory: a second pinned 16-bit copy of the shard (docs/parallel.md)."),
      int_key("parallel.offload_threads", LMSCALE_FIELD(parallel.offload_threads), 0,
              "Host threads of each rank's offloaded AdamW; 0 = the hardware threads divided by the dp ranks "
              "(assumed to share one host) (docs/parallel.md)."),
      int_key("parallel.timeout_s", LMSCALE_FIELD(parallel.timeout_s), 0,
              "train and bench-model: when a step, evaluation or checkpoint has not finished after this many "
              "seconds, or a communicator reports an asynchronous error (NCCL), the ranks' watchdogs compare notes "
              "and one line names the rank that died or hangs; the job ends with exit 1 within about this + 10 s; "
              "0 = off (docs/checkpoints.md)."),
      bool_key("parallel.overlap_optimizer", LMSCALE_FIELD(parallel.overlap_optimizer),
               "CUDA without a sharded optimizer: run the optimizer step on a second stream, bucket by bucket in "
               "forward order, and let the next forward wait per unit only for its own parameters (same results, "
               "the update hidden behind the next step's forward; the gradients of a unit live until its next "
               "forward). Ignored with parallel.tp or parallel.pp > 1 (docs/parallel.md)."),
      bool_key("parallel.overlap_param_gather", LMSCALE_FIELD(parallel.overlap_param_gather),
               "zero1 and zero2 (without tp or pp): after the step, all-gather the parameters the forward reads (the "
               "bf16/fp16 working copy, else the fp32 master) asynchronously in segments of forward order, and let "
               "the next forward wait per unit only for its own segment (same results; the gather hidden behind the "
               "next step's forward). Ignored by the other modes. Off by default: on 2 H200 (NVLink) the xl zero2 "
               "step took 78.2-79.9 ms with it and 77.1-77.3 without (the forward slows beside the gathers)."),
      int_key("parallel.comm_sms", LMSCALE_FIELD(parallel.comm_sms), 0,
              "CUDA with NCCL: SMs left to the collectives that overlap compute. NCCL communicators get at most this "
              "many CTAs (ncclConfig_t maxCTAs) and the cuBLASLt GEMMs that can run beside them (the backward with "
              "data parallelism; the forward too with fsdp or pp) are planned for the remaining SMs "
              "(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), so neither waits for the other's SMs; 0 = NCCL's and "
              "cuBLASLt's defaults. At most half the GPU's SMs."),
      int_key("parallel.fsdp_prefetch", LMSCALE_FIELD(parallel.fsdp_prefetch), 0,
              "fsdp: units (embedding, blocks, head) whose all-gather runs ahead of the unit computing; 1 = unit "
              "i's gather starts once unit i-2's forward is done."),
      bool_key("parallel.reshard_after_forward", LMSCALE_FIELD(parallel.reshard_after_forward),
               "fsdp: free each unit's gathered weights after its forward and gather them again for its backward "
               "(false: keep them from the forward to the backward; more memory, fewer gathers)."),
      enum_key("parallel.fsdp_gather_dtype", LMSCALE_FIELD(parallel.fsdp_gather_dtype),
               "fsdp: the element type of the units' weight all-gathers. compute: the compute dtype (bf16 in mixed "
               "precision). fp8 (precision.mode = fp8 with current scaling): the blocks' seven FP8 linear weights "
               "travel in e4m3, 1 byte per element, cast before the gather with the per-tensor scale of their amax "
               "reduced (max) over the dp group, and the FP8 GEMMs read them as gathered: bitwise the results of "
               "compute; the embedding and LM head units gather in the compute dtype."),
      int_key("parallel.microbatches", LMSCALE_FIELD(parallel.microbatches), 1,
              "Pipeline microbatches per step; must divide the per-rank batch when pp > 1."),
      enum_key("parallel.schedule", LMSCALE_FIELD(parallel.schedule),
               "Pipeline schedule: gpipe (all forwards, then all backwards), 1f1b (one forward, one backward "
               "in the steady state), interleaved (1F1B over parallel.virtual_stages chunks per rank; microbatches a "
               "multiple of pp), zb-h1 (Zero Bubble's ZB-H1: 1F1B with each backward's weight gradients deferred "
               "into the wait for the next gradient; more memory, not with fsdp). Each composes with parallel.tp "
               "(tensor-parallel stages) and dp. Fewer, larger microbatches can beat a smaller bubble (xl: "
               "inputs/pp_xl_zbh1.ini, docs/parallel.md)."),
      int_key("parallel.virtual_stages", LMSCALE_FIELD(parallel.virtual_stages), 1,
              "interleaved: model chunks per pipeline rank; num_layers must be divisible by pp * virtual_stages."),
      layer_counts_key("parallel.stage_layers", LMSCALE_FIELD(parallel.stage_layers),
                       "Blocks per pipeline stage, comma-separated (e.g. 10,14); empty = balanced by layers (the "
                       "first stage also holds the embedding, the last the final norm, LM head and loss)."),
      // [bench]
      enum_key("bench.mode", LMSCALE_FIELD(bench.mode),
               "bench-model: what one timed step does (forward-backward includes waiting for the "
               "data-parallel gradient reduction; train-step adds clipping and the optimizer)."),
      int_key("bench.warmup", LMSCALE_FIELD(bench.warmup), 0,
              "Untimed warm-up iterations (bench-model steps, attention, GEMM and collective iterations)."),
      int_key("bench.steps", LMSCALE_FIELD(bench.steps), 1,
              "Timed iterations (bench-model steps, attention, GEMM and collective iterations)."),
      int_key("bench.batch_size", LMSCALE_FIELD(bench.batch_size), 1,
              "bench-model: global batch size (sequences); bench-gemm: sequences per GEMM (M = batch_size * "
              "model.context_length rows)."),
      bool_key("bench.memory_timeline", LMSCALE_FIELD(bench.memory_timeline),
               "bench-model: record every allocation and free into /memory/timeline."),
      enum_list_key("bench.impls", LMSCALE_FIELD(bench.impls),
                    "bench-attention: attention implementations to compare."),
      enum_list_key("bench.passes", LMSCALE_FIELD(bench.passes), "bench-attention: passes to time."),
      int_list_key("bench.attn_batch", LMSCALE_FIELD(bench.attn_batch), 1, {}, "bench-attention: batch sizes."),
      int_list_key("bench.attn_heads", LMSCALE_FIELD(bench.attn_heads), 1, {}, "bench-attention: numbers of heads."),
      int_list_key("bench.seq_lens", LMSCALE_FIELD(bench.seq_lens), 1, {}, "bench-attention: sequence lengths."),
      int_list_key("bench.head_dims", LMSCALE_FIELD(bench.head_dims), 1, {},
                   "bench-attention: head dimensions (flash on CUDA: at most 256)."),
      enum_list_key("bench.dtypes", LMSCALE_FIELD(bench.dtypes),
                    "bench-attention and bench-collectives: element types."),
      enum_list_key("bench.gemm_precisions", LMSCALE_FIELD(bench.gemm_precisions),
                    "bench-gemm: how each GEMM runs: fp32, bf16 (ops::linear; CUDA only), fp8 (the FP8 linear "
                    "layers of precision.mode = fp8: e4m3 x and w, precision.fp8_grad_format dy; the CPU runs "
                    "their emulation)."),
      bool_list_key("bench.causal", LMSCALE_FIELD(bench.causal), "bench-attention: causal masking settings to sweep."),
      enum_list_key("bench.ops", LMSCALE_FIELD(bench.ops), "bench-collectives: collectives to time."),
      enum_key("bench.algo", LMSCALE_FIELD(bench.algo),
               "bench-collectives: the backend's own algorithm (library), lmscale's ring over send/recv, "
               "node-local shared memory with threads (shm, mpi backend), shm inside each node plus library between "
               "node leaders (hier, all-reduce across nodes, mpi backend), or auto (shm on one node, hier across "
               "nodes, for large messages)."),
      bytes_key("bench.min_bytes", LMSCALE_FIELD(bench.min_bytes), 1, "bench-collectives: smallest message size."),
      bytes_key("bench.max_bytes", LMSCALE_FIELD(bench.max_bytes), 1, "bench-collectives: largest message size."),
      int_key("bench.step_factor", LMSCALE_FIELD(bench.step_factor), 2,
              "bench-collectives: each size is the previous one times this factor."),
      bool_key("bench.inplace", LMSCALE_FIELD(bench.inplace), "bench-collectives: send and receive in the same buffer."),
      bool_key("bench.check", LMSCALE_FIELD(bench.check), "bench-collectives: verify the result of every size."),
      enum_key("bench.format", LMSCALE_FIELD(bench.format),
               "bench-collectives: the stdout table. table: lmscale's (one row per op, size and algorithm); "
               "nccl-tests: the layout of NVIDIA's nccl-tests (size, count, type, redop, root, then out-of-place and "
               "in-place time, algbw, busbw and #wrong, and the \"# Avg bus bandwidth\" line), so that the parsers "
               "written for nccl-tests read it (docs/jobs.md). The HDF5 tables are the same either way."),
      // [train]
      int_key("train.steps", LMSCALE_FIELD(train.steps), 1, "Optimizer steps."),
      int_key("train.batch_size", LMSCALE_FIELD(train.batch_size), 1,
              "Global batch size (sequences per optimizer step, over all data-parallel ranks)."),
      int_key("train.grad_accum", LMSCALE_FIELD(train.grad_accum), 1,
              "Gradient accumulation steps; must divide the per-rank batch."),
      int_key("train.eval_every", LMSCALE_FIELD(train.eval_every), 0, "Evaluate every this many steps; 0 = never."),
      int_key("train.eval_batches", LMSCALE_FIELD(train.eval_batches), 1, "Batches per evaluation."),
      int_key("train.log_every", LMSCALE_FIELD(train.log_every), 1, "Print a progress line every this many steps."),
      string_key("train.save", "path", LMSCALE_FIELD(train.save), "Final weights file: safetensors when the name ends in .safetensors, HDF5 otherwise "
                 "(docs/hdf5.md); empty = do not save."),
      string_key("train.resume", "path", LMSCALE_FIELD(train.resume),
                 "Checkpoint to resume from: empty = fresh start; auto = the newest complete checkpoint in "
                 "train.checkpoint_dir (fresh start if none); a step directory (DIR/step_NNNNNNNN) of a sharded "
                 "checkpoint; or a single-file checkpoint (train.checkpoint_path, train.save) (docs/checkpoints.md)."),
      int_key("train.checkpoint_every", LMSCALE_FIELD(train.checkpoint_every), 0,
              "Write a training checkpoint every this many steps (and at the end); 0 = never (a sharded one is "
              "still written on SIGTERM/SIGUSR1 and at the end when train.checkpoint_dir is set)."),
      string_key("train.checkpoint_path", "path", LMSCALE_FIELD(train.checkpoint_path),
                 "Single-file training checkpoint (one process and DDP only), used when train.checkpoint_dir is "
                 "empty."),
      string_key("train.checkpoint_dir", "path", LMSCALE_FIELD(train.checkpoint_dir),
                 "Directory of sharded checkpoints (step_NNNNNNNN/, one file per rank and an index; any layout "
                 "resumes any other's); empty = none. Written every train.checkpoint_every steps, at the end, and "
                 "when the run is preempted (docs/checkpoints.md)."),
      int_key("train.max_skipped_steps", LMSCALE_FIELD(train.max_skipped_steps), 0,
              "Stop a diverging run (exit 1, results kept, no weights saved) after this many consecutive steps "
              "that were skipped or had a non-finite loss or gradient norm; 0 = never (docs/reliability.md)."),
      bool_key("train.cuda_graphs", LMSCALE_FIELD(train.cuda_graphs),
               "train and bench-model (bench.mode = train-step): capture the whole train step (forward, backward, "
               "gradient norm, clip and AdamW update) as one CUDA graph after an eager first step of each shape, "
               "and replay it: one launch instead of ~1500 per step. Same bits as without graphs. One process on "
               "one GPU with AdamW only; refused (exit 2) with several ranks, parallel.tp/pp/ep > 1, "
               "parallel.offload, parallel.overlap_optimizer, MoE models, and on the "
               "CPU (docs/architecture.md §5)."),
      int_key("train.keep_checkpoints", LMSCALE_FIELD(train.keep_checkpoints), 0,
              "Newest complete sharded checkpoints kept in train.checkpoint_dir (older ones are removed after a "
              "new one is complete); 0 = keep all."),
      enum_key("train.on_newer_checkpoints", LMSCALE_FIELD(train.on_newer_checkpoints),
               "What train.resume from an older checkpoint does when train.checkpoint_dir holds newer ones (another "
               "history, which rotation and a later train.resume = auto would mix with the new one): refuse (exit 2 "
               "before any work); move-aside (the newer step folders are moved into "
               "train.checkpoint_dir/superseded-<UTC time>/, kept but no longer resumed) (docs/checkpoints.md)."),
      enum_key("train.activation_checkpointing", LMSCALE_FIELD(train.activation_checkpointing),
               "Activation checkpointing (train and bench-model): none; every-k (keep the input of each group of "
               "train.checkpoint_k blocks, recompute the group in the backward); selective (recompute the norms' "
               "outputs, the SwiGLU product and naive attention's probabilities; keep the matmul and flash outputs); "
               "selective-mlp (selective, and the FFN's w1/w3 outputs recomputed too: less memory, two more GEMMs)."),
      int_key("train.checkpoint_k", LMSCALE_FIELD(train.checkpoint_k), 1,
              "Blocks per group of activation_checkpointing = every-k (1 = every block); at most model.num_layers."),
      bool_key("train.checkpoint_keep_attention", LMSCALE_FIELD(train.checkpoint_keep_attention),
               "activation_checkpointing = every-k only: every block also keeps its attention output [N, d] and "
               "the attention's log-sum-exp (flash; naive: its probabilities), so the backward's recompute skips "
               "the attention kernel, the costliest part of a block at long context (8b at 32k tokens: about 40% "
               "of the recompute's FLOPs for 256 MiB a block). Results are unchanged."),
      int_key("train.checkpoint_layers", LMSCALE_FIELD(train.checkpoint_layers), 0,
              "activation_checkpointing = every-k only: checkpoint only the first N blocks of the model (of each "
              "pipeline stage, or interleaved chunk); the blocks after them keep all their activations and are "
              "not recomputed (Megatron's block method: spare memory buys less recompute). 0 = every block; at "
              "most model.num_layers. Results are unchanged."),
      // [optim]
      enum_key("optim.name", LMSCALE_FIELD(optim.name),
               "Optimizer: adamw (decoupled decay); sgd (torch.optim.SGD: momentum, L2-coupled weight decay, "
               "optim.nesterov); lars (You et al. 2017: momentum SGD with the layer-wise trust ratio "
               "optim.trust_coefficient ||w|| / (||g|| + wd ||w||)); lamb (You et al. 2019: Adam moments with the "
               "trust ratio ||w|| / ||update||). lars and lamb exclude the RMSNorm gains from the ratio and the decay "
               "(docs/optimizers.md)."),
      float_key("optim.lr", LMSCALE_FIELD(optim.lr), R::positive(), "Peak learning rate."),
      float_key("optim.min_lr", LMSCALE_FIELD(optim.min_lr), R::non_negative(),
                "Learning rate at the end of the cosine schedule; at most lr."),
      int_key("optim.warmup_steps", LMSCALE_FIELD(optim.warmup_steps), 0,
              "Linear warm-up steps; at most train.steps."),
      int_key("optim.cosine_steps", LMSCALE_FIELD(optim.cosine_steps), 0,
              "Step at which the cosine schedule reaches min_lr; 0 = train.steps."),
      float_key("optim.weight_decay", LMSCALE_FIELD(optim.weight_decay), R::non_negative(),
                "Weight decay: decoupled for adamw, added to the gradient (L2) for sgd and lars, part of the update "
                "for lamb."),
      float_key("optim.beta1", LMSCALE_FIELD(optim.beta1), R::unit_open_right(), "AdamW/LAMB beta1."),
      float_key("optim.beta2", LMSCALE_FIELD(optim.beta2), R::unit_open_right(),
                "AdamW/LAMB beta2 (a model.size preset sets its own unless given)."),
      float_key("optim.eps", LMSCALE_FIELD(optim.eps), R::positive(), "AdamW/LAMB epsilon."),
      float_key("optim.grad_clip", LMSCALE_FIELD(optim.grad_clip), R::non_negative(),
                "Clip the global gradient norm to this value; 0 = off."),
      float_key("optim.momentum", LMSCALE_FIELD(optim.momentum), R::unit_open_right(),
                "Momentum of sgd and lars, in [0, 1) (0 = none)."),
      bool_key("optim.nesterov", LMSCALE_FIELD(optim.nesterov),
               "Nesterov momentum (sgd only; needs optim.momentum > 0)."),
      float_key("optim.trust_coefficient", LMSCALE_FIELD(optim.trust_coefficient), R::positive(),
                "LARS trust coefficient eta: local lr = eta ||w|| / (||g|| + wd ||w||); > 0."),
      int_key("optim.reference_batch", LMSCALE_FIELD(optim.reference_batch), 0,
              "Linear LR scaling: the schedule's lr and min_lr are multiplied by (global batch in sequences) / "
              "reference_batch, the global batch being train.batch_size (bench: bench.batch_size); 0 = off."),
      // [data]
      enum_key("data.source", LMSCALE_FIELD(data.source),
               "Training data: synthetic random tokens, a token file (data.path), or a UTF-8 text file (data.path) "
               "read as bytes, one token per byte (needs model.vocab_size >= 256; docs/recipes.md)."),
      string_key("data.path", "path", LMSCALE_FIELD(data.path),
                 "Token file (raw little-endian token ids of type data.dtype), or with data.source = text a UTF-8 "
                 "text file."),
      string_key("data.val_path", "path", LMSCALE_FIELD(data.val_path),
                 "Evaluation token or text file; empty = data.path (text: its tail, data.val_fraction)."),
      float_key("data.val_fraction", LMSCALE_FIELD(data.val_fraction), R::unit_open_right(),
                "data.source = text without data.val_path: share of the file's bytes, taken from its end, held out "
                "for evaluation; 0 = evaluate on the training text."),
      enum_key("data.dtype", LMSCALE_FIELD(data.dtype), "Element type of the token files."),
      // [accounting]
      float_key("accounting.device_tflops", LMSCALE_FIELD(accounting.device_tflops), R::non_negative(),
                "Communication analysis: dense FLOP/s per device in TFLOP/s; 0 = the datasheet peak of the device "
                "(H100/H200 SXM: 989.4 bf16/fp16, 66.9 fp32) for precision.mode."),
      float_key("accounting.link_gbps", LMSCALE_FIELD(accounting.link_gbps), R::positive(),
                "Communication analysis: per-GPU link bandwidth in GB/s, one direction (H100/H200 NVLink 4: 450)."),
      int_key("accounting.world", LMSCALE_FIELD(accounting.world), 0,
              "run.job = accounting: ranks of the planned run, so that one process plans any layout; parallel.dp = 0 "
              "resolves against it. 0 = parallel.dp x tp x pp when parallel.dp is set, else the ranks launched."),
      enum_key("accounting.device", LMSCALE_FIELD(accounting.device),
               "run.job = accounting: the device of the planned run, whose memory and peak FLOP/s the accounting "
               "uses instead of this machine's (docs/jobs.md, accounting): h100-80gb (H100 SXM 80 GB, 81559 MiB as CUDA "
               "reports it), h200 (141 GB, 143771 MiB), cpu (no device peak, host memory not known). "
               "auto = the GPU this process sees; without one, h100-80gb for parallel.device = cuda and cpu "
               "otherwise."),
      // [cost] (docs/recipes.md "Cost")
      float_key("cost.tokens", LMSCALE_FIELD(cost.tokens), R::non_negative(),
                "accounting: estimate GPU-hours and money for training on this many tokens (FLOPs = 6 x matmul "
                "parameters + 12 L T d per token); 0 = no estimate. Needs cost.mfu or cost.mfu_from."),
      int_key("cost.gpus", LMSCALE_FIELD(cost.gpus), 0,
              "accounting: GPUs of the costed run; 0 = the deck's parallel layout (dp x tp x pp)."),
      float_key("cost.price_per_gpu_hour", LMSCALE_FIELD(cost.price_per_gpu_hour), R::non_negative(),
                "On-demand price of one GPU-hour (any currency); 0 = no money figures. train: prints the projected "
                "cost to finish beside its ETA."),
      float_key("cost.spot_discount", LMSCALE_FIELD(cost.spot_discount), R::unit_open_right(),
                "Fraction taken off cost.price_per_gpu_hour (spot/preemptible machines; 0.6 = 60% cheaper)."),
      float_key("cost.mfu", LMSCALE_FIELD(cost.mfu), FloatRange{0.0, 1.0, true, true},
                "accounting: model FLOPs utilisation of the costed run against the device peak "
                "(accounting.device_tflops); 0 = read it from cost.mfu_from."),
      string_key("cost.mfu_from", "path", LMSCALE_FIELD(cost.mfu_from),
                 "accounting: a bench-model results file whose measured MFU (/bench_model attribute mfu) is used when "
                 "cost.mfu = 0."),
      float_key("cost.checkpoint_gbps", LMSCALE_FIELD(cost.checkpoint_gbps), R::positive(),
                "accounting: bandwidth at which a checkpoint (fp32 weights + AdamW m, v: 12 B per parameter) is "
                "written, GB/s over all writers."),
      float_key("cost.checkpoint_interval_h", LMSCALE_FIELD(cost.checkpoint_interval_h), R::non_negative(),
                "accounting: hours of training between checkpoints (one more at the end); 0 = no checkpoints (a "
                "preemption then loses half the run on average)."),
      float_key("cost.preemptions_per_gpu_hour", LMSCALE_FIELD(cost.preemptions_per_gpu_hour), R::non_negative(),
                "accounting: expected preemptions per GPU-hour (spot machines; 0 = on-demand). Each loses half a "
                "checkpoint interval of work plus cost.restart_minutes."),
      float_key("cost.restart_minutes", LMSCALE_FIELD(cost.restart_minutes), R::non_negative(),
                "accounting: minutes to get machines back and load the checkpoint after a preemption."),
      // [prune] (docs/recipes.md "Pruning")
      string_key("prune.weights", "path", LMSCALE_FIELD(prune.weights),
                 "prune: the weights file to prune (written by train.save; safetensors when the name ends in "
                 ".safetensors, HDF5 otherwise); the [model] keys must describe it."),
      enum_key("prune.method", LMSCALE_FIELD(prune.method),
               "prune: unstructured (smallest |w| over all attention and FFN matrices of all layers, one global "
               "threshold; embedding, LM head and norms kept) or structured (whole FFN hidden units: rows of w1, w3 "
               "and columns of w2 with the smallest L2 norm, the same number in every layer; the export has a "
               "smaller model.d_ff)."),
      enum_key("prune.schedule", LMSCALE_FIELD(prune.schedule),
               "prune: fixed (rounds of gamma until prune.target_sparsity) or loss-guided (rounds while the "
               "validation loss stays under the bound; the last round within it is kept)."),
      float_key("prune.target_sparsity", LMSCALE_FIELD(prune.target_sparsity), FloatRange{0.0, 1.0, false, false},
                "prune: fraction of the pruned parameters (structured: FFN units) removed at the end (fixed), or "
                "at most (loss-guided)."),
      int_key("prune.theta", LMSCALE_FIELD(prune.theta), 1,
              "prune: each round removes gamma = 1 - (1/10)^(1/theta) of the remaining weights, so theta rounds "
              "keep 1/10; the last round stops exactly at prune.target_sparsity."),
      int_key("prune.finetune_steps", LMSCALE_FIELD(prune.finetune_steps), 0,
              "prune: training steps (train.batch_size, optim.*) after each round, with the pruned weights held at "
              "zero."),
      float_key("prune.max_loss", LMSCALE_FIELD(prune.max_loss), R::non_negative(),
                "prune, loss-guided: the validation-loss bound (nats); 0 = the unpruned loss x (1 + "
                "prune.max_loss_increase)."),
      float_key("prune.max_loss_increase", LMSCALE_FIELD(prune.max_loss_increase), R::positive(),
                "prune, loss-guided with prune.max_loss = 0: allowed relative rise of the validation loss."),
      string_key("prune.output", "path", LMSCALE_FIELD(prune.output),
                 "prune: the pruned weights file (structured: physically smaller, d_ff attribute and shapes of the "
                 "smaller model; safetensors when the name ends in .safetensors, HDF5 otherwise); empty = none."),
  };
  for (DeckKey& k : plan_keys()) table.push_back(std::move(k));
  return table;
}

#undef LMSCALE_FIELD

}  // namespace

const std::vector<DeckKey>& deck_keys() {
  static const std::vector<DeckKey> table = build_table();   // constant after first use
  return table;
}

const DeckKey* find_deck_key(const std::string& name) {
  for (const auto& k : deck_keys())
    if (k.name == name) return &k;
  return nullptr;
}

std::vector<std::string> deck_key_names() {
  std::vector<std::string> names;
  for (const auto& k : deck_keys()) names.push_back(k.name);
  return names;
}

std::vector<std::string> deck_sections() {
  std::vector<std::string> sections;
  for (const auto& k : deck_keys())
    if (sections.empty() || sections.back() != k.section()) sections.push_back(k.section());
  return sections;
}

}  // namespace lmscale::io::detail
