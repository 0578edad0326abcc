#pragma once
// The CS336 "basics" Transformer LM (docs/architecture.md §2): forward, loss and backward over the flat
// parameter store. Activations needed by the backward are kept in an Activations object between
// forward() and backward(); a forward without gradients frees them layer by layer.
//
// Shapes: B = local batch, T = sequence length (<= context), N = B*T rows, d = d_model,
// F = d_ff, H heads of Dh = d/H, V = vocab.
// Tensor parallelism (model/tensor_parallel.h; the split comes from the parameter store, the
// collectives from ParallelContext::tp): each rank computes Hl = H/tp heads (q, k, v, o are
// [N, dl], dl = Hl*Dh), Fl = F/tp FFN features (a, b, g [N, Fl]) and Vl = V/tp vocabulary columns
// of the logits ([N, Vl]); with sequence parallelism the norms' inputs/outputs and the residual
// stream (x, h, rstd, y1, y2, the final norm's input and output) are row shards [Nl, d], Nl = N/tp; without it
// Nl = N and they are replicated on the tp ranks. Token and target ids are int32 [B, T] on the model's
// device. Activations are [N, d] (equivalently [B, T, H, Dh] for attention) in the compute dtype
// (fp32/fp64, or bf16/fp16 in mixed precision); norms' rstd and the loss are fp32 (fp64).
#include <memory>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"
#include "lmscale/model/fp8_layers.h"
#include "lmscale/model/fp8_weight_casts.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/model/moe_block.h"
#include "lmscale/model/param_layout.h"
#include "lmscale/model/parallel_context.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/recompute.h"

namespace lmscale::model {

// What one block saved in the forward for its backward.
struct BlockActivations {
  Tensor x;                 // block input [N,d]
  Tensor rstd1, y1;         // RMSNorm1: rstd [N], output [N,d]
  // Projections after RoPE (q, k), each [N,dl] with rows 3*dl elements apart: column blocks of
  // one [N, 3*dl] buffer (q|k|v side by side, one GEMM each way, also the one FP8 layer of
  // precision.mode = fp8). The views cover exactly (N-1)*3*dl + dl elements
  // (docs/architecture.md, "fused projections").
  Tensor q, k, v;
  Tensor attn_aux;          // naive: probs [B,H,T,T]; flash: lse [B,H,T]
  Tensor o;                 // attention output before output_proj [N,d]
  Tensor h;                 // x + attention [N,d]
  Tensor rstd2, y2;         // RMSNorm2 [N], [N,d]
  // w1 y2, w3 y2, silu(a)*b [N,F]; a and b are column blocks of one [N, 2F] buffer (row stride
  // 2F: one GEMM, or one FP8 layer, against the back-to-back [W1; W3]); g is contiguous. MoE
  // block: the experts' [Me,Fe].
  Tensor a, b, g;
  MoeActivations moe;       // MoE block: routing and expert rows (model/moe_block.h)
  // precision.mode = fp8: each FP8 layer's quantised x^T, w^T and scales (ops::Fp8LinearSaved);
  // a recomputed block keeps only the scales, which its recompute casts with again.
  Fp8BlockSaved fp8;
};

// One weight-gradient product whose input gradient has already run (the zero-bubble pipeline's
// W pass; parallel/pipeline.h): the weight gradients ops::linear_backward (one parameter) or
// ops::linear_side_by_side_backward (a group: q|k|v, w1|w3) would have made in the block's
// backward. x [N,K] is the layer's input (rows gathered under sequence parallelism), dy [N, n*R]
// the output gradient of the n parameters side by side; the tensors are kept alive (and the
// residual stream's gradient copied) until the W pass runs.
struct WeightGradWork {
  Tensor x;
  Tensor dy;
  std::vector<int> params;   // store indices (a group: q, k, v or w1, w3)
  bool accumulate = true;
};

struct Activations {
  std::int64_t B = 0, T = 0;
  Tensor tokens, targets;                 // int32 [B,T]
  std::vector<BlockActivations> blocks;   // L entries when kept (empty ones under every-k)
  std::vector<Tensor> group_inputs;       // every-k checkpointing: input [N,d] of each group
  // d(loss)/d(last block output) [Nl,d]: the head unit (final norm, LM head, loss) ran its
  // backward inside the training forward (fused LM head + cross-entropy, no logits kept).
  Tensor dx_final;
  bool accumulate = true;                 // how that forward wrote the head's gradients
  Tensor loss_sum;                        // 1 element (fp32; fp64 for fp64 models)
  Tensor output;                          // pipeline stage without the head: its output [N,d]
  // MoE: the router losses' contribution to loss_sum [1] (sum of ops::moe_router_losses terms[2]
  // over the MoE blocks), added after the head; grad_scale of the forward, for their backward.
  Tensor moe_loss;
  double grad_scale = 0;
  // Zero-bubble B pass (backward_stage with defer_weights): the blocks' weight-gradient products
  // left for backward_weights, in the order the backward reached them.
  bool defer_weights = false;
  std::vector<WeightGradWork> weight_work;
};

class TransformerLM {
 public:
  // compute: the activation dtype (= params.lowp_dtype()).
  TransformerLM(const ModelDims& dims, ParameterStore& params);
  // A pipeline chunk: runs `units`, one of params.chunks() (interleaved: several models share
  // one store). The two-argument form runs the store's single unit range.
  TransformerLM(const ModelDims& dims, ParameterStore& params, StageUnits units);
  const StageUnits& units() const { return units_; }

  const ModelDims& dims() const { return dims_; }
  ParameterStore& params() { return params_; }

  // precision.mode = fp8 (docs/precision.md): the blocks' dense linear layers run their three
  // GEMMs through one ops::Fp8Linear per layer (q|k|v, o, w1|w3, w2: model/fp8_layers.h), made
  // here for this model's blocks after checking that the store holds each group back to back.
  // Dense models without tensor parallelism only (the deck refuses the others).
  void enable_fp8(Context& ctx, const ops::Fp8LinearOptions& options);
  // The FP8 layers and their scaling state (null unless enable_fp8 was called).
  const Fp8Layers* fp8() const { return fp8_.get(); }
  Fp8Layers* fp8() { return fp8_.get(); }
  // precision.fp8_weight_casts = optimizer where the step allows it (parallel::
  // step_casts_fp8_weights): the blocks' FP8 weights cast by the optimizer step instead of each
  // forward (model/fp8_weight_casts.h). After enable_fp8, delayed scaling on CUDA, every FP8
  // layer's weight [R, K] of 64-multiples (fp8_weight_cast_shape). Null until enabled.
  void enable_fp8_weight_casts(Context& ctx);
  Fp8WeightCasts* fp8_weight_casts() { return fp8_casts_.get(); }
  // The cast of block `layer`'s FP8 layer g among fp8_weight_casts()->casts().
  std::size_t fp8_cast_index(int layer, Fp8Gemm g) const;

  // What the forward keeps for the backward (activation checkpointing); default none.
  void set_recompute(const RecomputePolicy& p) { recompute_ = p; }
  const RecomputePolicy& recompute() const { return recompute_; }

  // Forward over tokens[B,T] and the loss over targets[B,T]; with `keep` (training) also what the
  // backward needs (as the recompute policy says). grad_scale = d(loss)/d(sum of token losses)
  // for the backward: 1 / (global number of target tokens), times the fp16 loss scale. Returns
  // the activations (holding loss_sum, the sum of this rank's token losses, on the device). pc's
  // forward hooks are called around each unit.
  // The LM head and cross-entropy run fused in row chunks (model.ce_chunk_rows): the [N,V] logits
  // never exist. With `keep` the head unit's (L+1) backward runs inside this forward, from the
  // same chunks (no logits kept, none recomputed): lm_head's and ln_final's gradients are
  // written here (overwritten unless `accumulate`, as backward() does), so pc must already hold
  // the micro-batch's backward hooks: before_backward(L+1), on_grad_ready(lm_head, ln_final) and
  // after_backward(L+1) are called from here (parallel_context.h), and backward() must get the
  // same hooks and the same `accumulate` (checked).
  std::unique_ptr<Activations> forward(Context& ctx, const Tensor& tokens, const Tensor& targets, bool keep,
                                       double grad_scale, const ParallelContext& pc = {}, bool accumulate = true);
  // Logits [B*T, V] only (no loss); for evaluation of checkpoints and tests. Tensor parallel:
  // this rank's vocabulary columns [B*T, V/tp].
  Tensor logits(Context& ctx, const Tensor& tokens, const ParallelContext& pc = {});
  // Accumulates parameter gradients into params().flat_grads() (accumulate = true: zero them
  // first for a fresh step) or overwrites them (accumulate = false: the first micro-batch of a
  // step, which saves a pass over the whole gradient buffer); frees the activations as it goes.
  // Calls pc.on_grad_ready(i) for each parameter and pc's backward hooks around each unit, from
  // the last block's down (the head unit's ran in forward()).
  void backward(Context& ctx, Activations& act, const ParallelContext& pc, bool accumulate = true);

  // ---- Pipeline stages (model/stage.h; src/model/transformer_stage.cpp) ----------------------
  // The model runs its units (units(): the store's, or its chunk's): the schedule in parallel/
  // calls these once per microbatch. forward_stage: `input` is tokens int32 [B,T] when the stage
  // owns the embedding, else the previous stage's output [B*T,d] in the compute dtype; `targets`
  // int32 [B,T] is read by the stage owning the head (loss, grad_scale as in forward()). With
  // `keep` (training) keeps what the backward needs (as the recompute policy says) and, on the
  // stage owning the head, runs the head unit's backward as forward() does (pc with the
  // micro-batch's backward hooks, `accumulate`); without it only the loss (evaluation). A stage
  // without the head leaves its output [B*T,d] in act->output. Tensor parallel stages (tp x pp):
  // every [B*T,d] of these two calls is the residual stream as this tp rank holds it, [Nl,d]
  // (replicated, Nl = B*T; sequence parallel, this rank's row shard, Nl = B*T/tp), and pc must
  // carry the tp callbacks as for forward().
  std::unique_ptr<Activations> forward_stage(Context& ctx, const Tensor& input, const Tensor& targets,
                                             std::int64_t B, std::int64_t T, bool keep, double grad_scale,
                                             const ParallelContext& pc = {}, bool accumulate = true);
  // backward_stage: dy = d(loss)/d(stage output) [B*T,d] (ignored by the stage owning the head,
  // which starts from the gradient its forward left in act.dx_final; consumed in place otherwise). Returns the gradient
  // w.r.t. the stage input [B*T,d] for the previous stage, or an undefined tensor on the stage
  // owning the embedding. Gradients accumulate as in backward().
  // defer_weights (the zero-bubble schedules' B pass): the blocks' matmul weight gradients (q, k,
  // v, o, w1, w3, w2; not the norms', the embedding's or an MoE block's FFN) are not computed but
  // left in act.weight_work, and their on_grad_ready is not called; backward_weights (the W
  // pass) computes them later, bitwise the same products.
  Tensor backward_stage(Context& ctx, Activations& act, Tensor dy, const ParallelContext& pc, bool accumulate,
                        bool defer_weights = false);
  // The W pass: runs the deferred products in order, calling pc.on_grad_ready for each parameter.
  void backward_weights(Context& ctx, std::vector<WeightGradWork>& work, const ParallelContext& pc);

  // ---- Mixture of experts (transformer_moe.cpp, docs/moe.md) ---------------------------------
  // Routing counts and router losses per MoE block, summed over the training forwards (keep =
  // true) since the last reset; one entry per MoE block of this model, in layer order. The losses
  // are summed on the model's device as the forwards run (no host read per block); this call
  // reads them, once, waiting for the forwards queued so far.
  const std::vector<MoeLayerStats>& moe_stats(Context& ctx);
  void reset_moe_stats();
  // The expert split this model computes (from the parameter store).
  const ExpertSplit& expert_split() const { return ep_; }

 private:
  Tensor run_blocks_forward(Context& ctx, Activations& act, Tensor x, bool keep, const ParallelContext& pc);
  // Final RMSNorm and LM head: x [Nl,d] -> all logits [N,Vl] (logits() only; the loss never
  // materialises them).
  Tensor head_logits(Context& ctx, const Tensor& x, const ParallelContext& pc);
  // The head unit L+1 on the last block's output x [Nl,d] (transformer_head.cpp): final RMSNorm,
  // then the LM head and cross-entropy fused in row chunks; loss_sum [1] gets the sum of the N
  // rows' token losses. With `grad` (a training forward) the unit's backward runs here too:
  // lm_head's and ln_final's gradients, pc's before/after_backward(L+1) and on_grad_ready; it
  // returns d(loss)/dx [Nl,d]. Without it returns an undefined tensor. The caller calls the
  // forward hooks around it.
  struct HeadGrad {
    double scale;      // grad_scale of forward()
    bool accumulate;   // add to the gradients (false: overwrite them)
  };
  Tensor head_unit(Context& ctx, const Tensor& x, const Tensor& targets, Tensor& loss_sum, const HeadGrad* grad,
                   const ParallelContext& pc);
  // Vocabulary-parallel form of the chunked head (transformer_tp.cpp): y [N,d] (gathered rows),
  // this rank's w [Vl,d]; per chunk the logits [rows,Vl], loss() with its all-reduces, and with
  // grad the partial input gradient into dy's rows and w's gradient dw; dy [N,d] is summed over
  // tp (f backward) at the end, overlapped with the last chunk's weight-gradient GEMM. Returns
  // the summed input gradient ([Nl,d]) when grad, else an undefined tensor.
  Tensor head_chunks_tp(const ParallelContext& pc, Context& ctx, const Tensor& y, const Tensor& w,
                        const Tensor& targets, Tensor& loss_sum, Tensor* dy, Tensor* dw, const HeadGrad* grad,
                        std::int64_t chunk_rows);
  // The backward of blocks [lo, hi) after the head's, every-k: recomputes the group first.
  void blocks_backward(Context& ctx, Activations& act, Tensor& dx, const ParallelContext& pc, bool accumulate);
  // x [N,d] -> block output [N,d]; what the backward needs goes into s. need_output = false
  // (recomputing the last block of a checkpointed group) stops after what the backward reads.
  // record_fp8 = false (an evaluation forward): FP8 casts add nothing to delayed scaling's history.
  Tensor block_forward(Context& ctx, int layer, std::int64_t B, std::int64_t T, const Tensor& x,
                       BlockActivations& s, const ParallelContext& pc, bool need_output = true,
                       bool record_fp8 = true);
  // dx [N,d]: in = gradient w.r.t. the block output, out = w.r.t. the block input (in place).
  // defer: leave the matmul weight gradients there instead of computing them (B pass).
  void block_backward(Context& ctx, int layer, BlockActivations& s, Tensor& dx, const ParallelContext& pc,
                      std::int64_t B, std::int64_t T, bool accumulate, double grad_scale,
                      std::vector<WeightGradWork>* defer = nullptr);
  // The weight gradients of params (ws' gradients) from input x and output gradient dy (side by
  // side for a group): now (with on_grad_ready), or appended to defer. A dy that shares storage
  // with `residual` (the residual stream's gradient, which the norms' backward then changes in
  // place) is copied first.
  void weight_grads(Context& ctx, const ParallelContext& pc, const Tensor& x, Tensor dy,
                    std::vector<int> params, bool accumulate, std::vector<WeightGradWork>* defer,
                    const Tensor& residual);
  // MoE FFN of block l on y2 [N,d] (N = B*T rows, sequences of T): router, dispatch, experts,
  // combine; returns its output [N,d] and keeps what the backward needs in s (s.moe, s.a/b/g).
  Tensor moe_ffn_forward(Context& ctx, int layer, std::int64_t T, const Tensor& y2, BlockActivations& s,
                         const ParallelContext& pc);
  // Its backward from d(output) dout [N,d]: the experts' and the router's gradients; returns
  // d(loss)/d(y2) [N,d]. grad_scale: the forward's, for the router losses' own gradient.
  Tensor moe_ffn_backward(Context& ctx, int layer, std::int64_t T, BlockActivations& s, const Tensor& dout,
                          const ParallelContext& pc, bool accumulate, double grad_scale);
  // Adds block l's routing counts to moe_stats_ and its router losses (ops::moe_router_losses
  // terms[0..1]) to moe_terms_, on the device.
  void record_moe_stats(Context& ctx, int layer, const BlockActivations& s, const Tensor& terms);
  // ---- FP8 linear layers (transformer_fp8.cpp) ----------------------------------------------
  // y = x w^T through block l's FP8 layer g; its saved entry goes into s.fp8[g]. A group layer's
  // w is its parameters' rows [sum R_i, K] (fp8_gemm_params: q|k|v, w1|w3) and its y the
  // side-by-side [N, sum R_i]. A first forward, or, when s.fp8[g] holds the scales of an earlier
  // forward (a recompute), a replay with the saved scales (bitwise the same, no scaling state
  // touched). A null y: only the saved operands (a recompute whose output is not needed). A
  // weight the store hands out in fp8_e4m3 (fsdp's FP8 gathers) is used as it is, with its scales
  // (ParameterStore::fp8_weight), instead of cast.
  // x_amax: from_producer when x's producer wrote its amax (fp8_input_amax).
  void fp8_linear(Context& ctx, int layer, Fp8Gemm g, const Tensor& x, Tensor* y, BlockActivations& s, bool record,
                  ops::Fp8Amax x_amax = ops::Fp8Amax::measure);
  // fp8_linear's GEMM from x quantised already (a first forward, or a replay when s.fp8[g] holds scales).
  void fp8_linear_quantised(Context& ctx, int layer, Fp8Gemm g, const ops::Fp8Input& xq, Tensor* y,
                            BlockActivations& s, bool record);
  // Whether block l's SwiGLU casts the w2 layer's input (forward) and the w1|w3 layer's output
  // gradient (backward) itself (fp8_swiglu_casts_fused) instead of writing g and da|db: a first
  // forward of a dense FP8 block (a replay casts with saved scales from the stored g).
  bool fp8_swiglu_fused(int layer, const BlockActivations& s) const;
  // The w2 layer's forward from SwiGLU's fused cast of a, b [rows, F] (s.a, s.b): y [rows, d];
  // its saved entry goes into s.fp8[w2], as fp8_linear's.
  void fp8_linear_from_swiglu(Context& ctx, int layer, BlockActivations& s, std::int64_t rows, Tensor& y, bool record);
  // The slot for the amax of block l's FP8 layer g's input, for the op that makes the input: given
  // under current scaling with producer amaxes (Fp8LinearOptions::producer_amax) in a first
  // forward; none for a replay (it casts with saved scales) or without FP8.
  Fp8ProducerAmax fp8_input_amax(int layer, Fp8Gemm g, const BlockActivations& s);
  // The same for layer g's output gradient dy (its backward's operand).
  Fp8ProducerAmax fp8_grad_amax(int layer, Fp8Gemm g);
  // Whether block l's w2 layer finds its dy's amax written by block l + 1's last norm backward
  // (the residual gradient between the two blocks): both blocks in this model, producer amaxes on.
  bool fp8_w2_grad_amax_from_above(int layer) const;
  // Layer g's weight [sum R_i, K]: a view of its parameters' working copies, which every store
  // layout holds back to back (refused, naming the layer, where not).
  Tensor fp8_group_weight(int layer, Fp8Gemm g) const;
  // The same for weights the store hands out quantised: one view and one scale for the group
  // (refused, naming the layer, when the gather did not cast the group with one scale).
  ops::Fp8Weight fp8_group_weight_quantised(int layer, Fp8Gemm g) const;
  // The backward of layer g from dy [N, sum R_i]: dx (overwritten; null: skipped) and the
  // gradients of its parameters (added unless !accumulate; one GEMM when back to back), then
  // their on_grad_ready; frees s.fp8[g].
  void fp8_linear_backward(Context& ctx, const ParallelContext& pc, int layer, Fp8Gemm g, BlockActivations& s,
                           const Tensor& dy, Tensor* dx, bool accumulate,
                           ops::Fp8Amax dy_amax = ops::Fp8Amax::measure);
  // The same from dy quantised already (ops::Fp8Linear::quantize_grad: SwiGLU's fused cast);
  // dy's operands are freed before the gradient hooks run.
  void fp8_linear_backward(Context& ctx, const ParallelContext& pc, int layer, Fp8Gemm g, BlockActivations& s,
                           ops::Fp8Input dy, Tensor* dx, bool accumulate);
  // A dense block's backward with its linear layers in FP8 (block_backward's FP8 form).
  void block_backward_fp8(Context& ctx, int layer, BlockActivations& s, Tensor& dx, const ParallelContext& pc,
                          std::int64_t B, std::int64_t T, bool accumulate);
  // The attention core's backward (shared by both forms): dO [N,dl] -> dq, dk, dv as one
  // [3,N,dl] tensor (returned), RoPE's backward applied to dq and dk; frees s.o, s.attn_aux.
  Tensor attention_core_backward(Context& ctx, BlockActivations& s, const Tensor& dO, std::int64_t B, std::int64_t T);

  // y = rmsnorm(x, w) [N,d] unless y is already there (selective checkpointing dropped it).
  void recompute_norm(Context& ctx, const Tensor& x, const Tensor& w, Tensor& y, std::int64_t N, std::int64_t d);
  // s.a = w1 y2, s.b = w3 y2 of block l (y2 [N,d], gathered under sequence parallelism).
  // y2_amax: from_producer when y2's producer wrote its amax (fp8_input_amax of w13).
  void ffn_inputs(Context& ctx, BlockActivations& s, const Tensor& y2, int l, bool record_fp8 = true,
                  ops::Fp8Amax y2_amax = ops::Fp8Amax::measure);
  // Gradient of parameter i, zeroed first unless accumulating (for the ops that always add).
  Tensor grad_for_adding(Context& ctx, int i, bool accumulate);
  // Store indices of block `layer`'s parameters (a pipeline stage's store holds only its units'
  // parameters, indexed locally).
  BlockParams block_params(int layer) const;

  // ---- tensor parallelism (transformer_tp.cpp) ------------------------------------------------
  // Megatron's conjugate operators at the two points of each sublayer; identities with tp = 1.
  // f: y [Nl,d] -> the column-parallel matmul's input [N,d] (sequence parallel: all-gather rows).
  Tensor tp_f(const ParallelContext& pc, Context& ctx, const Tensor& y);
  // f backward: the partial input gradient [N,d] summed over tp -> [Nl,d] (all-reduce in place,
  // or reduce-scatter of rows).
  Tensor tp_f_backward(const ParallelContext& pc, Context& ctx, Tensor& dy);
  // f backward started asynchronously: the result is usable after finish(); in between the
  // caller computes the weight gradients (they do not read dy). Synchronous without sum_async.
  struct PendingGrad {
    Tensor result;
    TensorParallelComm::Wait wait;
    Tensor finish() {
      if (wait) wait();
      wait = nullptr;
      return result;
    }
  };
  PendingGrad tp_f_backward_start(const ParallelContext& pc, Context& ctx, Tensor& dy);
  // g: a row-parallel matmul's partial output [N,d] summed over tp -> [Nl,d].
  Tensor tp_g(const ParallelContext& pc, Context& ctx, Tensor& partial);
  // g backward: d(output) [Nl,d] -> [N,d] (sequence parallel: all-gather rows).
  Tensor tp_g_backward(const ParallelContext& pc, Context& ctx, const Tensor& d);
  // RMSNorm backward into gradient dw; under sequence parallelism each rank sees only its rows,
  // so the weight gradient of this call is summed over tp before it is added. accumulate_dx: the
  // input gradient is added to dx (the residual stream's gradient) instead of overwriting it.
  // dx_amax: max |dx| after the call (ops::rmsnorm_backward; not under sequence parallelism).
  void norm_backward(const ParallelContext& pc, Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd,
                     const Tensor& dy, Tensor& dx, Tensor& dw, bool accumulate_dx = false,
                     Tensor* dx_amax = nullptr);
  // Token embedding of ids [N] -> x [Nl,d] (vocabulary-parallel: partial lookups, then g).
  Tensor embed(const ParallelContext& pc, Context& ctx, const Tensor& ids);
  // Its backward from dx [Nl,d] into the (local) table gradient (accumulates).
  void embed_backward(const ParallelContext& pc, Context& ctx, const Tensor& ids, const Tensor& dx, Tensor& dtable);
  // Cross-entropy of logits [rows,Vl] (the full V with tp = 1): loss_sum, and the gradient in
  // place when keep; vocabulary-parallel: max and sum of exponentials all-reduced, logits never
  // gathered. One row chunk of the fused head.
  void loss(const ParallelContext& pc, Context& ctx, Tensor& logits, const Tensor& targets, Tensor& loss_sum,
            bool keep, double grad_scale);
  // Rows this rank holds of the residual stream: N, or N/tp under sequence parallelism.
  std::int64_t local_rows(std::int64_t N) const;

  ModelDims dims_;
  ParameterStore& params_;
  DType compute_;
  DType stats_;   // dtype of rstd and loss: fp64 for fp64 models, fp32 otherwise
  RecomputePolicy recompute_;
  StageUnits units_;
  TensorSplit tp_;                  // from the parameter store
  ExpertSplit ep_;                  // from the parameter store
  std::vector<MoeLayerStats> moe_stats_;
  std::unique_ptr<Fp8Layers> fp8_;  // precision.mode = fp8 only
  std::unique_ptr<Fp8WeightCasts> fp8_casts_;   // the step's casts, indexed by fp8_cast_index
  // [MoE blocks, 2] in the statistics dtype on the model's device: row i holds the sums of
  // terms[0] and terms[1] of moe_stats_[i]'s block since the last reset (made at the first record).
  Tensor moe_terms_;
  std::int64_t Hl_, dl_, Fl_, Vl_;  // local heads, their width Hl*Dh, FFN features, vocabulary
};

}  // namespace lmscale::model
