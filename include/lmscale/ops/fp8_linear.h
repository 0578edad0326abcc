#pragma once
// One linear layer y = x w^T with its three GEMMs in FP8 (docs/precision.md, "The GEMMs and their
// layouts"): x and w in e4m3, dy in e5m2 (or e4m3), each operand with its own Fp8TensorScaling
// held here, so a model keeps one Fp8Linear per linear layer (layers reading one input, as q|k|v,
// run as one layer over their weights' rows: model/fp8_layers.h). Another layer may still read
// this layer's quantised input (Fp8Input). Shapes: x [M,K] (any leading dims flattened into M),
// w [N,K], y and dy [M,N].
//
// forward() returns what backward() needs from it (the quantised transposes of x and w and the
// inverse scales they were made with), for the caller to keep with the layer's other saved
// activations: a pipeline schedule runs several forwards before their backwards, and each
// backward must use its own forward's operands.
#include <cstdint>
#include <functional>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/fp8.h"
#include "lmscale/core/tensor.h"
#include "lmscale/ops/fp8.h"
#include "lmscale/ops/fp8_scaling.h"

namespace lmscale::ops {

struct Fp8LinearOptions {
  Fp8Recipe recipe = Fp8Recipe::current;
  int history = 16;    // delayed scaling's amax window, in casts of each operand
  int margin = 0;      // scales divided by 2^margin
  Fp8Format grad_format = Fp8Format::e5m2;
  // Current scaling: a model hands the kernels producing its layers' inputs and output gradients
  // their x and dy slots (x_producer_amax, dy_producer_amax) so no separate amax pass runs
  // (docs/precision.md, "Amaxes from the producers"). false: every amax is measured by its own
  // pass (bitwise the same results; tests compare the two). Delayed scaling ignores it.
  bool producer_amax = true;
  // Delayed scaling: the producers that can (the model's SwiGLU) cast its layers' inputs and output
  // gradients themselves, never storing them in the compute dtype (model::fp8_swiglu_casts_fused;
  // docs/precision.md, "Casts fused into the producers"). false: the separate casts (bitwise the
  // same results; tests compare the two). Current scaling ignores it (its scale needs the amax first).
  bool producer_casts = true;
  // How the GEMMs accumulate on CUDA (Fp8Accumulation; precision.fp8_fast_accum): the forward
  // product y = x w^T in every call that makes it (forward, and replay: activation checkpointing's
  // recompute; evaluation forwards are forwards), and the two gradient products dx, dW. The
  // default is the deck's, the recipe of Transformer Engine and torchao: the forward fast, the
  // gradients promoted (docs/precision.md, "Error bounds"). The CPU emulation ignores both.
  Fp8Accumulation forward_accumulation = Fp8Accumulation::fast;
  Fp8Accumulation grad_accumulation = Fp8Accumulation::promoted;
};

// The forward's operands for the backward: xt_q [K,M] and wt_q [K,N] (fp8) and the scales they
// were made with, scales [16] fp32 holding {x scale, x inverse, w scale, w inverse} at elements
// 0, 4, 8, 12 (copies, written by one ops::gather_scalars launch, so later forwards may rescale
// freely; replay() casts with them again). xt_q is one tensor for every layer that read the
// same Fp8Input (freed with the last of their entries).
// Each value starts a 16-byte line because the inverses are the backward GEMMs' scale pointers:
// with the four packed in 16 bytes (pointers 4 and 12 bytes into a line) every backward product
// failed on an H100 with CUBLAS_STATUS_NOT_SUPPORTED, while the same products with separately
// allocated scales passed; with each on its own 16-byte line they pass (H100, 2026-11-27), so
// 16-byte alignment is taken to be cuBLASLt's requirement, and ops::linear_fp8 checks it. An
// entry with scales but no operands is what activation checkpointing keeps of a recomputed layer.
struct Fp8LinearSaved {
  static constexpr std::int64_t kScaleStride = 4;   // fp32 elements: 16 bytes
  Tensor xt_q, wt_q, scales;
  Tensor x_scale() const { return scales.flat_range(0 * kScaleStride, 1); }
  Tensor x_inv() const { return scales.flat_range(1 * kScaleStride, 1); }
  Tensor w_scale() const { return scales.flat_range(2 * kScaleStride, 1); }
  Tensor w_inv() const { return scales.flat_range(3 * kScaleStride, 1); }
  bool has_operands() const { return xt_q.defined(); }
  // Keeps the scales only (the operands are freed).
  void drop_operands() {
    xt_q = Tensor();
    wt_q = Tensor();
  }
};

// One quantisation of a layer input x [M,K] under the x scaling of the layer that owns it, which
// every layer reading the same x may share: q [M,K] for the forward GEMM (undefined when no GEMM needs it), qt [K,M] for
// the weight gradients, and the scale and inverse it was cast with (1 element fp32 each; the
// owner's scaling tensors, or views of a saved entry's scales for a replay).
struct Fp8Input {
  Tensor q, qt, scale, inv;
};

// A weight quantised before the layer sees it (fsdp's FP8 weight gathers, parallel/fsdp_fp8_gather.h):
// q [N,K] e4m3 = fp8(w * scale) with scale = 2^k from amax by current scaling's rule
// (fp8_update_scale), bitwise what this layer's current scaling casts from the same w. amax,
// scale, inv: 1 element fp32 each, on the data's device (inv 16-byte aligned on CUDA, as
// ops::linear_fp8 requires).
// Or cast by the optimizer step under the layer's own w scaling (delayed scaling,
// model/fp8_weight_casts.h): scale and inv are then w_scaling()'s tensors, and qt [K,N] its
// transpose made in the same pass (else the layer transposes q).
struct Fp8Weight {
  Tensor q, amax, scale, inv;
  Tensor qt;
};

class Fp8Linear {
 public:
  Fp8Linear(Context& ctx, const Fp8LinearOptions& options);

  // y[M,N] = x w^T, y bf16 or fp32 on CUDA (fp32 or fp64 on CPU, where x and w may be fp32 or
  // fp64: the CPU emulates the FP8 numerics exactly, up to the GEMM's accumulation order).
  // On CUDA K and M must be multiples of 16 (the FP8 GEMMs' reduction lengths include both).
  // record = false (evaluation): no amax enters delayed scaling's history (Fp8TensorScaling).
  // The same as forward(quantize_input(x), w, y).
  Fp8LinearSaved forward(Context& ctx, const Tensor& x, const Tensor& w, Tensor& y, bool record = true);
  // The forward from an input quantised once for several layers: saved.xt_q is x.qt (shared).
  Fp8LinearSaved forward(Context& ctx, const Fp8Input& x, const Tensor& w, Tensor& y, bool record = true);

  // The same with the weight already quantised. Current scaling: w's scaling adopts w's amax,
  // scale and inverse (so its state is what a cast of the same w would leave), no cast of w runs,
  // and saved.wt_q = transpose_fp8(w.q). Bitwise the forward from the compute-dtype w. A weight cast
  // under this layer's own w scaling (the optimizer step's casts, any recipe) is read as it is, and
  // saved.wt_q = w.qt where given.
  Fp8LinearSaved forward(Context& ctx, const Fp8Input& x, const Fp8Weight& w, Tensor& y);

  // x quantised under this layer's x scaling, for it and the layers sharing its input. amax:
  // from_producer when x's producer wrote its amax into x_producer_amax() (current scaling).
  Fp8Input quantize_input(Context& ctx, const Tensor& x, bool record = true, Fp8Amax amax = Fp8Amax::measure);
  // x cast with the x scale of a saved entry's `scales` (a replay: no scaling state is read or
  // changed); q only when `direct` (a GEMM will read it).
  Fp8Input replay_input(Context& ctx, const Tensor& scales, const Tensor& x, bool direct) const;

  // The forward again, cast with the scales a forward recorded in `scales` (its saved entry's):
  // bitwise the same y and operands for the same x and w, and no scaling state is read or
  // changed (activation checkpointing's recompute must not advance delayed scaling's history).
  // y may be null: only the operands for the backward are made. The result shares `scales`.
  Fp8LinearSaved replay(Context& ctx, const Tensor& scales, const Tensor& x, const Tensor& w, Tensor* y);
  // The same from replay_input's result (its x scale must be that of `scales`).
  Fp8LinearSaved replay(Context& ctx, const Tensor& scales, const Fp8Input& x, const Tensor& w, Tensor* y);

  // The replay from a quantised weight: w.q is used as it is (its scale must be the one in
  // `scales`, as it is for the same weights under current scaling); no scaling state changes.
  Fp8LinearSaved replay(Context& ctx, const Tensor& scales, const Fp8Input& x, const Fp8Weight& w, Tensor* y);

  // dx[M,K] = dy w (overwritten; skipped when null), dw[N,K] (+)= dy^T x (skipped when null;
  // fp32 on CUDA when accumulating), from saved's operands and dy quantised here. dy_amax:
  // from_producer when dy's producer wrote its amax into dy_producer_amax() (current scaling).
  void backward(Context& ctx, const Fp8LinearSaved& saved, const Tensor& dy, Tensor* dx, Tensor* dw,
                bool accumulate_dw, Fp8Amax dy_amax = Fp8Amax::measure);
  // The same with dw given as its row blocks (a group layer, e.g. q|k|v over [3dl, K], whose
  // weights' gradients do not lie back to back): dws[i] [N_i, K] with sum N_i = N; dW_i (+)=
  // dy[:, rows i]^T x, one GEMM each over the contiguous row block i of the quantised dy^T [N, M]
  // (the same dy scaling as one dW GEMM: bitwise its rows).
  void backward(Context& ctx, const Fp8LinearSaved& saved, const Tensor& dy, Tensor* dx, const std::vector<Tensor>& dws,
                bool accumulate_dw, Fp8Amax dy_amax = Fp8Amax::measure);

  // Casts made by the producers of x and dy (delayed scaling; lmscale/ops/fp8.h, "Casts fused
  // into their producers"): q [rows, cols] and qt [cols, rows] are allocated here and `cast`
  // writes them under the operand's scale and history update (Fp8TensorScaling::
  // quantize_in_producer), bitwise what quantize_input / quantize_grad make of the producer's
  // output. quantize_grad makes q only when `direct` (a dx GEMM reads it).
  using ProducerCast = std::function<void(const Tensor& scale, const Fp8HistoryUpdate& update, Tensor* q, Tensor& qt)>;
  Fp8Input quantize_input(Context& ctx, std::int64_t rows, std::int64_t cols, const ProducerCast& cast,
                          bool record = true);
  Fp8Input quantize_grad(Context& ctx, std::int64_t rows, std::int64_t cols, const ProducerCast& cast, bool direct);
  // dy [..., N] quantised under this layer's dy scaling, as backward() does.
  Fp8Input quantize_grad(Context& ctx, const Tensor& dy, bool direct, Fp8Amax dy_amax = Fp8Amax::measure);
  // backward() from a dy that quantize_grad made.
  void backward(Context& ctx, const Fp8LinearSaved& saved, const Fp8Input& dy, Tensor* dx,
                const std::vector<Tensor>& dws, bool accumulate_dw);

  // The slots where the ops producing the next x and the next dy write their amaxes (current
  // scaling only: Fp8TensorScaling::producer_amax), [1] fp32 each.
  Tensor x_producer_amax() { return x_.producer_amax(); }
  Tensor dy_producer_amax() { return dy_.producer_amax(); }

  const Fp8TensorScaling& x_scaling() const { return x_; }
  const Fp8TensorScaling& w_scaling() const { return w_; }
  const Fp8TensorScaling& dy_scaling() const { return dy_; }
  // A resumed run sets them to a checkpoint's state (Fp8TensorScaling::restore).
  Fp8TensorScaling& x_scaling() { return x_; }
  Fp8TensorScaling& w_scaling() { return w_; }
  Fp8TensorScaling& dy_scaling() { return dy_; }
  Fp8Accumulation forward_accumulation() const { return forward_accumulation_; }
  Fp8Accumulation grad_accumulation() const { return grad_accumulation_; }

 private:
  Fp8TensorScaling x_, w_, dy_;
  Fp8Accumulation forward_accumulation_, grad_accumulation_;
};

}  // namespace lmscale::ops
