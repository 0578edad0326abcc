#pragma once
// The allocation replay behind the per-phase memory prediction (include/lmscale/jobs/
// memory_model.h). The activations and gradient buckets are not summed from formulas but
// replayed: a small simulator allocates and frees the bytes of every tensor in the order
// src/model/transformer.cpp (and transformer_head.cpp, transformer_stage.cpp,
// transformer_tp.cpp) does, so the peak lands where the real one does. Keep it in step with the
// model: the CPU test (ctest/regression/memory_prediction.sh) fails when they drift apart by
// over 5%. Private to src/jobs (memory_model.cpp: one process, DDP, ZeRO, FSDP, tp;
// memory_model_pipeline.cpp: one pipeline rank's stage under its schedule, its units FSDP-sharded
// over dp or not; memory_replay_fsdp.cpp: FSDP's units, gathers and unit gradients for both).
#include <algorithm>
#include <string>
#include <vector>

#include "lmscale/comm/mesh.h"
#include "lmscale/io/config.h"
#include "lmscale/jobs/predict/memory_model.h"
#include "lmscale/model/fp8_layers.h"
#include "lmscale/model/param_layout.h"
#include "lmscale/model/recompute.h"
#include "lmscale/parallel/spec.h"

namespace lmscale::jobs::replay {

// Current and peak bytes of one rank's allocator, as its MemoryTracker counts them: the bytes
// asked for. (The CUDA caching allocator rounds blocks to 512 B / 2 MiB and may hand out a cached
// block up to 1.25x larger, but its tracker records the requested size, and /memory/peaks is what
// the prediction is compared with; `round` stays the identity.)
struct Sim {
  bool cuda = false;
  double cur = 0, peak = 0;
  double round(double b) const { return b; }
  double alloc(double b) {
    b = round(b);
    cur += b;
    peak = std::max(peak, cur);
    return b;
  }
  void free(double& b) {
    cur -= b;
    b = 0;
  }
};

// A buffer with several holders (a pipeline stage's input: the schedule's variable and the
// activations that keep it); freed when the last one lets go.
struct Shared {
  double bytes = 0;
  int refs = 0;
  void drop(Sim& m) {
    if (--refs == 0) m.free(bytes);
  }
};

// What block_forward keeps (bytes, already rounded; 0 = not held). An MoE block's a, g are the
// experts' [Me,Fe] (a: the [2,Me,Fe] pair) and it keeps the routing (model/moe_block.h).
struct Block {
  double x = 0, rstd1 = 0, y1 = 0, q = 0, k = 0, v = 0, o = 0, aux = 0, h = 0, rstd2 = 0, y2 = 0, a = 0, b = 0, g = 0;
  double probs = 0, lse = 0, experts = 0, gates = 0, slot = 0, xe = 0, ye = 0, perm = 0;
  // precision.mode = fp8, per FP8 layer (model::Fp8Gemm order qkv, o, w13, w2): its saved x^T
  // and w^T (1 byte per element) and its saved scales ([16] fp32; kept alone by a recomputed
  // block, whose recompute then replays instead of allocating new ones).
  double f8x[model::kFp8GemmsPerBlock] = {}, f8ops[model::kFp8GemmsPerBlock] = {};
  double f8scales[model::kFp8GemmsPerBlock] = {};
};

// One micro-batch's shapes as one rank holds them (tensor parallel: local heads, d_ff, vocab;
// Nl rows of the residual stream under sequence parallelism).
struct Shapes {
  double N = 0, Nl = 0, d = 0, dl = 0, F = 0, H = 0, T = 0, B = 0, V = 0, e = 4, st = 4;
  bool flash = false, sp = false, cuda = false, deterministic = false;
  bool fp8 = false;   // precision.mode = fp8: the blocks' linear layers through ops::Fp8Linear
  // parallel.fsdp_gather_dtype = fp8: the blocks' weights arrive quantised (fsdp's e4m3 gathers),
  // so the FP8 layers make no cast of w (only its transpose).
  bool fp8_weights = false;
  // parallel::step_casts_fp8_weights: the optimizer step casts the blocks' weights and keeps their
  // codes and transposes (model/fp8_weight_casts.h): no cast and no transpose of w in a forward.
  bool fp8_step_casts = false;
  // model::fp8_swiglu_casts_fused: SwiGLU casts the w2 layer's x and the w1|w3 layer's dy itself
  // (no g, no da|db in the compute dtype; on the CPU the op makes them as temporaries).
  bool fp8_swiglu_fused = false;
  bool fp8_swiglu_kernel = false;   // ... in one CUDA kernel (no temporary)
  int L = 0, tp = 1;
  double chunk = 1;   // rows per chunk of the fused LM head + cross-entropy
  int k = 1;
  model::RecomputePolicy recompute;   // the model's: keep_attention, checkpointed_end
  // Mixture of experts (docs/moe.md, transformer_moe.cpp): every moe_every-th block; E experts,
  // El = E / ep of them on this rank, top-k, expert d_ff Fe; M = the kept assignments of this
  // rank's N tokens: N k dropless, else at most B E capacity (routing decides; the bound is
  // taken); Me = the rows this rank's experts compute (M: with ep > 1, balanced routing assumed).
  int moe_every = 0;   // 0: dense
  int ep = 1;
  double E = 0, El = 0, topk = 0, Fe = 0, M = 0, Me = 0;
  bool is_moe(int l) const { return moe_every > 0 && l % moe_every == moe_every - 1; }
  model::ParamIndex index() const;
};

// The shapes of a micro-batch of `rows` sequences under the deck's model, precision, tp and
// checkpointing.
Shapes shapes_for(const Config& cfg, double rows, bool cuda);

// Parameter sizes (elements) in the store's order: embedding, per layer q,k,v,o,ln1,w1,w3,w2,ln2
// (transformer.cpp's Slot order), ln_final, lm_head; local shapes under tensor parallelism.
std::vector<double> param_sizes(const Shapes& s);
// model::ParamIndex::joins_next of each parameter, in the same order (ParamInfo::joins_next).
std::vector<bool> param_joins(const Shapes& s);

// The gradient provider: LazyGradients allocates a parameter's bucket (parallel/grad_buckets.h:
// reverse parameter order, at most bucket_bytes each) the first time the backward asks for one
// of its gradients; with a flat buffer (or FSDP) nothing is allocated here. Parameters are named
// by their index in the whole model; `local` maps them to the store's (a pipeline stage holds a
// subset; empty: the whole model).
struct Grads {
  Sim* sim = nullptr;
  bool lazy = false;
  std::vector<int> local;
  std::vector<int> bucket_of;
  std::vector<double> bucket_bytes;
  std::vector<bool> held;
  // sizes in the store's order; joins[i]: parameter i runs one GEMM with i + 1 (param_joins).
  void init(const std::vector<double>& sizes, const std::vector<bool>& joins, double max_bytes);
  // FSDP (parallel/fsdp.cpp): units 0 = embedding, 1..L = blocks, L+1 = head; each unit's
  // weights gathered (compute dtype, padded to dp shards) ahead of use and released after it, its
  // full-size fp32 gradients allocated at the first gradient and freed once reduce-scattered
  // (kReductionsInFlight = 1 reduction left in flight).
  bool fsdp = false, training = false, reshard = true;
  // parallel.offload = optimizer (parallel/offloaded_shards.h): the gathers send the persistent
  // compute-dtype copy of the shard, no cast buffer.
  bool offloaded = false;
  // parallel.offload = optimizer+params: no device copy; each gather copies its shard up into a
  // send buffer [s_u] (any dtype), freed at the gather's wait.
  bool offloaded_params = false;
  int prefetch = 1, last = 0, dp = 1;
  int micro = 0;   // the micro-batch whose backward runs (later ones reduce into a temporary shard)
  double e = 4;
  std::vector<double> unit_padded;           // elements of each unit, padded to dp shards
  std::vector<int> unit_of_param;            // -1 for the replicated norms
  std::vector<double> gathered, full, send;  // bytes alive per unit (send: the cast shard, mixed precision)
  // parallel.fsdp_gather_dtype = fp8: the blocks' units (1..L) gather 1 B per element, their send
  // buffer is the e4m3 cast [s_u]; staged: optimizer+params' copied-up shard, kept until the wait.
  bool fp8_blocks = false;
  std::vector<double> staged;
  std::vector<double> pending;               // reductions in flight (full-size gradients)
  void gather(int u);
  void wait(int u);
  void release(int u);
  void before_forward(int u);
  void after_forward(int u);
  void before_backward(int u);
  void after_backward(int u);
  // bf16 gradient reduction (set_reduce_staging): per reduction group (bucket, or parameter
  // under ddp overlap) its staging bytes, allocated when the group's last gradient is written
  // and alive to the end of the step; group_of maps a store index to its group. finish_stage:
  // ddp flat's one copy, made in the sync's finish() instead.
  std::vector<int> group_of, group_pending;
  std::vector<double> group_stage;
  std::vector<bool> counted;
  double finish_stage = 0;
  bool staging_armed = true;   // the reduction is armed for this micro-batch (the last one's hooks)
  // The backward asks for parameter i's gradient (whole-model index); with ready_now its write is
  // done at once (the model's notify), else ready(i) says when.
  void touch(int i, bool ready_now = true);
  void ready(int i);
  void hold_all();     // every bucket allocated (gradients kept from an earlier micro-batch)
  double total() const;
  // Every bf16 copy of one step (the groups' and finish()'s): what is alive when finish() ends.
  double staging_total() const;
};

// FSDP over dp ranks (parallel/fsdp.cpp, memory_replay_fsdp.cpp): sets gr up for the units of
// the parameters the store holds (`local`: whole-model index -> the store's, -1 where another
// pipeline stage holds it; empty: the whole model) and returns the long-lived bytes: fp32 master
// and gradient shards, optimizer state of the shard, and the replicated norms' master, gradients
// and state.
double setup_fsdp(Grads& gr, const Config& cfg, const Shapes& s, int dp, const std::vector<int>& local);

// The zero-bubble schedule's deferred weight gradients (parallel.schedule = zb-h1,
// TransformerLM::WeightGradWork): per product, in the order the B pass made them (per block w2,
// then w1 and w3, o, then q, k and v; the last block first), the bytes its saved input and output
// gradients keep alive (the copied residual gradient included) and the parameters it writes.
struct DeferredProduct {
  double bytes = 0;
  std::vector<int> params;   // whole-model parameter indices
};
using DeferredWeights = std::vector<DeferredProduct>;

// precision.mode = fp8 (memory_replay_fp8.cpp, model/transformer_fp8.cpp): the scaling state of
// every FP8 operand (scale, inverse, amax history; fp32), alive from the model's construction.
double fp8_state_bytes(const Config& cfg, const Shapes& s);
// ops::Fp8Linear's forward of layer g from x [M,K] with w [n,K] (a group's rows) into the
// block's saved entry: x quantised (direct and transposed), its w (direct and transposed) and the
// scales; or, when b.f8scales[g] is held, the replay of a recompute (no scales; with_y false: no
// quantised direct operands are kept for a GEMM, as for the last block of a recompute whose w2
// output is not needed).
// producer_temp: bytes a fused producer's cast holds for a moment after x's operands are made
// (the CPU form of ops::swiglu_cast_transpose_fp8: the plain output, then the cast).
void fp8_forward(Sim& m, const Shapes& s, Block& b, model::Fp8Gemm g, double M, double K, double n,
                 bool with_y = true, double producer_temp = 0);
// Its backward from dy [M,n]: the layer's parameters' gradients asked for (a group's all, then
// one dW product), dy quantised (direct and transposed), the gradients written and ready; the
// saved entry freed.
// dy_q, dy_qt (given together): dy's operands made before (SwiGLU's fused cast), freed here where
// the layer's own would be.
void fp8_backward(Sim& m, Block& b, Grads& gr, model::Fp8Gemm g, double M, double n, const std::vector<int>& params,
                  double* dy_q = nullptr, double* dy_qt = nullptr);
// Frees layer g's saved operands (its x^T and w^T).
void free_fp8_operands(Sim& m, Block& b, model::Fp8Gemm g);
// Frees every FP8 layer's saved operands and scales of b.
void free_fp8(Sim& m, Block& b);
// A checkpointed block: its FP8 layers' scales move from the forward's b to what the block keeps.
void move_fp8_scales(Block& from, Block& to);
// A dense block's backward in FP8 (TransformerLM::block_backward_fp8).
void block_backward_fp8(Sim& m, const Shapes& s, Block& b, Grads& gr, int l);

// block_forward: allocations in transformer.cpp's order; returns the output's bytes (0 when a
// recompute's last block does not produce one).
double block_forward(Sim& m, const Shapes& s, Block& b, bool need_output, int l);
void free_block(Sim& m, Block& b);
// With defer (the B pass): the weight-gradient products are left in *defer
// (block_backward_deferred), otherwise computed in place.
void block_backward(Sim& m, const Shapes& s, Block& b, Grads& gr, int l, DeferredWeights* defer = nullptr);
// The B pass of one block (memory_replay_deferred.cpp): input gradients only; the products'
// inputs and output gradients move into w instead of being freed.
void block_backward_deferred(Sim& m, const Shapes& s, Block& b, Grads& gr, int l, DeferredWeights& w);
// The W pass (TransformerLM::backward_weights): each product's gradients asked for (lazy
// buckets), written (notified), then its saved tensors freed, in order; w is left empty.
void backward_weights(Sim& m, Grads& gr, DeferredWeights& w);
// The attention core's backward after dO [N,dl] (the caller's): dq, dk, dv as one [3,N,dl]
// tensor (its bytes returned), the kernels' workspaces; frees the aux, o and dO.
double attention_backward(Sim& m, const Shapes& s, Block& b, double& dO);
// A recomputed rmsnorm output (TransformerLM::recompute_norm) unless y is held: y [Nl,d] kept,
// the rstd twin dropped at once.
void recompute_norm(Sim& m, const Shapes& s, double& y);
// a and b: views of one [2,N,F] tensor (b.b stays 0), made after sequence parallelism's gather
// of y2 into a [N,d] temporary that lives until their GEMM is done (TransformerLM::ffn_inputs).
void ffn_inputs(Sim& m, const Shapes& s, Block& b);
// An MoE block's FFN (memory_replay_moe.cpp): the forward after y2, returning its output's bytes;
// the backward up to dx (ln2's gradient included, y2 and h freed).
double moe_forward(Sim& m, const Shapes& s, Block& b);
void moe_backward(Sim& m, const Shapes& s, Block& b, Grads& gr, int l);

// The units of a model or of a pipeline chunk, as TransformerLM runs them.
// The embedding's output [Nl,d] (the caller holds it).
double embed_forward(Sim& m, const Shapes& s, Grads& gr);
// Blocks [l0, l1) from an input the caller holds (blocks[l0].x stays 0: the caller frees the input
// once both it and, with `keep`, the activations are done with it, i.e. after blocks_backward);
// returns the last block's output (the caller's). blocks is indexed by global layer.
double blocks_forward(Sim& m, const Shapes& s, Grads& gr, std::vector<Block>& blocks, int l0, int l1, bool keep);
// Their backward (recomputing every-k groups); the input gradient dx is updated in place. With
// defer: the B pass, the weight-gradient products appended to *defer.
void blocks_backward(Sim& m, const Shapes& s, Grads& gr, std::vector<Block>& blocks, int l0, int l1,
                     DeferredWeights* defer = nullptr);
// The head unit on the last block's output (which the caller frees afterwards): allocates the
// loss sum (its bytes added to *loss; kept by the caller), runs the fused LM head in row chunks
// and, with `keep`, its backward; returns the gradient of its input [Nl,d] (0 without `keep`).
double head_forward(Sim& m, const Shapes& s, Grads& gr, bool keep, double* loss);
// The embedding's backward (its gradient; under sequence parallelism the gathered dx).
void embed_backward(Sim& m, const Shapes& s, Grads& gr);

// One process's micro-batch: its forward (keep = for a backward) and, if `backward`, its
// backward; returns the peak above what was held before.
double replay(const Shapes& s, Sim& m, Grads& gr, bool keep, bool backward);

// The initial (long-lived) bytes of a store of P parameters on one rank: fp32 master, bf16/fp16
// copy, the flat gradient buffer unless gradients are lazy (one process, zero2), and optimizer
// state (whole, or this dp rank's shard with its gradient shard; zero's even_split of P). Under
// expert parallelism dp_rank is the rank's index in its expert_dp group (ZeRO shards over it).
// cuda: a GPU run, whose offloaded optimizer state (parallel.offload) is not device memory.
double store_bytes(const Config& cfg, const parallel::Spec& spec, const Shapes& s, double P, int dp_rank, bool cuda);
// parallel.grad_reduce_dtype = bf16 (parallel/ddp.cpp launch, parallel/zero.cpp
// scatter_range_staged): the bf16 copies of the gradients made for the reduction, as the trainer
// builds the sync, alive to the end of its finish(): zero2 per bucket whatever parallel.ddp says
// (the send copy and this rank's received part, [max(mine, 1)]); without ZeRO, overlap one per
// parameter, bucketed one per bucket, ddp none (run as flat) and flat one copy of all made in
// finish() (finish_stage). Set as groups of gr (after gr.init); nothing unless dp > 1 and bf16
// (zero1 and fsdp refuse the key).
void set_reduce_staging(Grads& gr, const parallel::Spec& spec, const std::vector<double>& sizes, double P, int dp_rank);


}  // namespace lmscale::jobs::replay

namespace lmscale::jobs {
// Pipeline parallelism (memory_model_pipeline.cpp): the phases of mesh rank `rank`'s stage.
MemoryPhases predict_pipeline_phases(const Config& cfg, int world, bool cuda, int rank);
}  // namespace lmscale::jobs
