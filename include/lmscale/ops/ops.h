#pragma once
// The math of the model, behind one interface. Every function dispatches on the device of its
// tensors (ops/cpu/*.cpp: fp32 and fp64, OpenBLAS; ops/cuda/*.cu: fp32, bf16, fp16 with fp32
// accumulation, cuBLASLt + own kernels) and checks shapes and dtypes. Tensors are contiguous and
// row-major (the ops that take a row stride say so). "N" below is the number of token rows
// (batch * seq); d = d_model; F = d_ff; V = vocab. Backward functions that say "accumulates" add
// into their output (+=), so gradient accumulation over micro-batches needs no extra pass; the
// others overwrite.
#include <cstdint>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"

namespace lmscale::ops {

struct Fp8WeightCast;   // lmscale/ops/fp8.h

// ---- linear (matmul) -------------------------------------------------------------------------
// y[M,N] = x[M,K] . w[N,K]^T   (PyTorch nn.Linear layout, no bias)
void linear(Context& ctx, const Tensor& x, const Tensor& w, Tensor& y);
// dx[M,K] = dy[M,N] . w[N,K]       (overwrites; skipped when dx is null)
// dw[N,K] (+)= dy[M,N]^T . x[M,K]  (accumulates when accumulate_dw, else overwrites; skipped when
// dw is null). dw may be fp32 while x, w, dy are bf16/fp16 (mixed precision master gradients).
void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                     bool accumulate_dw);
// A group of linear layers reading one input (a block's q, k, v projections; the FFN's w1, w3):
//   ys[i][M,N] = x[M,K] . ws[i][N,K]^T     (the ws share a shape; outputs written through the handles)
// On CUDA one strided-batched GEMM when the weights lie back to back in memory (as the flat
// parameter store holds them) and the outputs are equally spaced (views of one [n,M,N] tensor),
// so small-batch products fill the GPU's SMs n times better; otherwise one product per weight.
void linear_group(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, const std::vector<Tensor>& ys);
// Its backward:
//   dx[M,K] = sum_i dys[i][M,N] . ws[i][N,K]    (each product added to dx in the GEMM epilogue:
//                                                no temporaries, no add kernels; skipped when null)
//   dws[i] (+)= dys[i]^T . x                     (batched like the forward when the dws and the dys
//                                                are equally spaced; skipped when dws is null)
void linear_group_backward(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws,
                           const std::vector<Tensor>& dys, Tensor* dx, const std::vector<Tensor>* dws,
                           bool accumulate_dw);

// A group of n linear layers reading one input, their outputs side by side in each row (a dense
// block's q|k|v and w1|w3 in the model; docs/architecture.md "fused projections"):
//   y[M, n*R] = x[M,K] . [ws[0]; ...; ws[n-1]]^T      (columns [i*R, (i+1)*R) are ws[i]'s output)
// The ws share a shape [R,K]. One GEMM when they lie back to back in memory (ws[i+1] starts
// R*K elements after ws[i], as the parameter store holds q, k, v and w1, w3); otherwise one product
// per weight into its column block (row stride n*R; on CUDA one strided batch where the ws are
// equally spaced, e.g. gradients of separately allocated buffers a fixed distance apart).
void linear_side_by_side(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, Tensor& y);
// Its backward, with dy[M, n*R] in the same side-by-side layout:
//   dx[M,K] = dy . [ws[0]; ...; ws[n-1]]   overwrites; ONE GEMM with inner dimension n*R when the
//                                          ws lie back to back (rounded once: no epilogue adds);
//                                          otherwise one product per weight on dy's column blocks,
//                                          the later ones added in the GEMM epilogue (as
//                                          linear_group_backward, whose bits it then gives)
//   dws[i] (+)= dy[:, iR:(i+1)R]^T . x     one GEMM when the ws and the dws lie back to back, else
//                                          one per weight reading its column block (row stride
//                                          n*R; on CUDA one strided batch where the dws are
//                                          equally spaced). The model's gradient layouts always
//                                          keep a group's dws back to back (parallel/grad_buckets.h).
// dx or dws null: skipped. dws may be fp32 beside bf16/fp16 x (as in linear_backward).
void linear_side_by_side_backward(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, const Tensor& dy,
                                  Tensor* dx, const std::vector<Tensor>* dws, bool accumulate_dw);

// ---- embedding -------------------------------------------------------------------------------
// out[N,d] = table[V,d][ids[N]]; ids int32 in [0, V) (checked on CPU).
void embedding(Context& ctx, const Tensor& ids, const Tensor& table, Tensor& out);
// dtable[V,d] += sum over rows n with ids[n]==v of dout[n,:]  (accumulates; deterministic order)
void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, Tensor& dtable);

// ---- RMSNorm ---------------------------------------------------------------------------------
// Producer amaxes (docs/precision.md, "Amaxes from the producers"): where an op below takes an
// `amax` (1 element fp32 on the data's device, or null), it is overwritten with max |out| over
// the output it names, bitwise what ops::amax of that output returns afterwards (NaN when any
// element is NaN, an inf when one is inf and none NaN), computed as the output is written: FP8
// current scaling reads it instead of a pass of its own over the tensor.
//
// y[N,d] = x * rsqrt(mean(x^2) + eps) * w[d], computed in fp32 (fp64 for fp64 inputs).
// rstd[N] (fp32; fp64 for fp64 inputs) is saved for the backward. y_amax: max |y|.
void rmsnorm(Context& ctx, const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd,
             Tensor* y_amax = nullptr);
// dx[N,d] overwritten (accumulate_dx: added to, as the residual stream's gradient is: no
// temporary and no add kernel); dw[d] accumulates. dx_amax: max |dx| over dx's values after the
// call (the sums when accumulating).
void rmsnorm_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                      Tensor& dx, Tensor& dw, bool accumulate_dx = false, Tensor* dx_amax = nullptr);
// The residual add and the RMSNorm after it in one pass (a block's h = x + attention output, then
// its FFN norm): sum = a + b (rounded to the dtype, as ops::add stores it), then ops::rmsnorm of
// that sum into y and rstd. Bitwise ops::add followed by ops::rmsnorm. y_amax: max |y|.
void add_rmsnorm(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& w, double eps, Tensor& sum, Tensor& y,
                 Tensor& rstd, Tensor* y_amax = nullptr);

// ---- RoPE ------------------------------------------------------------------------------------
// In place on x viewed as [B, T, H, Dh] (Dh even): pairs (2i, 2i+1) of the head vector at
// position t rotate by angle t * theta^(-2i/Dh). inverse=true rotates by the negative angle,
// which is exactly the backward (the rotation is orthogonal).
// row_stride (elements between consecutive (b, t) rows; 0 means H*Dh, a contiguous tensor) lets
// x be heads inside wider rows: the model rotates q and k together as the first 2H heads of its
// [N, 3*dl] q|k|v rows (row_stride 3*dl). x must hold (B*T - 1)*row_stride + H*Dh elements.
void rope(Context& ctx, Tensor& x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t Dh, double theta,
          bool inverse, std::int64_t row_stride = 0);

// ---- SwiGLU ----------------------------------------------------------------------------------
// h[N,F] = silu(a) * b, with a = w1 x, b = w3 x.
void swiglu(Context& ctx, const Tensor& a, const Tensor& b, Tensor& h);
// da, db [N,F] overwritten.
void swiglu_backward(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& dh, Tensor& da, Tensor& db);
// The same on a and b that are [rows, cols] blocks inside wider rows: element (r, c) of a, b (and
// of da, db) at r*ld + c, of h and dh at r*cols + c (contiguous). The model's a|b rows [N, 2F]
// give a = ab, b = ab + F, ld = 2F. a, b (da, db) must hold (rows - 1)*ld + cols elements; each
// element's arithmetic is the contiguous op's, so results are bitwise those of the plain form.
// h_amax: max |h| (producer amaxes, above); dab_amax: max |.| over the elements written to da
// and db together (the model's da|db [N, 2F] is one FP8 operand).
void swiglu_rows(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                 Tensor& h, Tensor* h_amax = nullptr);
void swiglu_rows_backward(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols,
                          std::int64_t ld, const Tensor& dh, Tensor& da, Tensor& db, Tensor* dab_amax = nullptr);

// ---- attention -------------------------------------------------------------------------------
// Strided layouts: element (b, h, t, e) of Q, K, V and their gradients dQ, dK, dV is at
// b*stride_b + h*stride_h + t*stride_t + e; of O and dO at b*o_stride_b + h*o_stride_h +
// t*o_stride_t + e. bthd / bhtd give both sets the same [B, T, H, Dh] / [B, H, T, Dh] strides
// (bench-attention uses [B, H, T, Dh]); the model's q, k, v are column blocks of one [N, 3*dl]
// buffer (with_qkv_row_stride(3*dl)) while o and dO are [N, dl].
struct AttentionShape {
  std::int64_t batch = 1, heads = 1, seq = 1, head_dim = 1;
  std::int64_t stride_b = 0, stride_h = 0, stride_t = 0;         // q, k, v, dq, dk, dv
  std::int64_t o_stride_b = 0, o_stride_h = 0, o_stride_t = 0;   // o, dO
  bool causal = true;
  double scale = 0;   // softmax scale; 0 means 1/sqrt(head_dim)
  // Flash backward without atomics (bit-reproducible dQ): on CUDA the FA2 two-kernel path (head
  // dims 16, 32, 64, 128 on tensor cores; others on CUDA cores) instead of the faster kernels that
  // add dQ's key-block shares with atomics or bulk reductions. CPU flash is always deterministic.
  bool deterministic = false;
  static AttentionShape bthd(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t Dh, bool causal = true);
  static AttentionShape bhtd(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t Dh, bool causal = true);
  // A [B, T, H, Dh] shape whose q, k, v (and dq, dk, dv) rows are row_stride elements apart
  // (>= H*Dh): stride_t = row_stride, stride_b = T*row_stride; o and dO keep their strides.
  AttentionShape& with_qkv_row_stride(std::int64_t row_stride);
  double softmax_scale() const;
  std::int64_t elements() const { return batch * heads * seq * head_dim; }
};
// Naive: materialises probs[B,H,T,T] (softmax in fp32 / fp64; probs stored in the input dtype
// on CUDA, fp32/fp64 on CPU), saved for the backward.
void attention_naive(Context& ctx, const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                     Tensor& o, Tensor& probs);
// dq, dk, dv overwritten.
void attention_naive_backward(Context& ctx, const AttentionShape& s, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& probs, const Tensor& dout, Tensor& dq, Tensor& dk,
                              Tensor& dv);
// FlashAttention-2: tiled, online softmax; saves lse[B,H,T] (fp32; fp64 for fp64 inputs).
void attention_flash(Context& ctx, const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                     Tensor& o, Tensor& lse);
// Recomputes P from lse; D = rowsum(dO * O). dq, dk, dv overwritten.
void attention_flash_backward(Context& ctx, const AttentionShape& s, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq,
                              Tensor& dk, Tensor& dv);

// ---- cross-entropy ---------------------------------------------------------------------------
// logits[N,V] (any float dtype), targets int32 [N]. loss_sum (1 element, fp32; fp64 for fp64
// logits) = sum over rows of (logsumexp(logits) - logits[target]). When dlogits is non-null it
// receives (softmax - onehot) * grad_scale, in logits' dtype; dlogits may alias logits (in place,
// so no second copy of the logits is kept). grad_scale is 1/(global token count) times any loss
// scale.
void cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, Tensor& loss_sum, Tensor* dlogits,
                   double grad_scale);

// ---- fused LM head + cross-entropy -------------------------------------------------------------
// The loss of logits z = y w^T without ever holding all of them: rows in chunks of chunk_rows (the
// last chunk may be shorter), one [chunk_rows, V] buffer reused. Per chunk c:
//   z_c = y_c w^T;  loss_sum += sum over its rows of (logsumexp(z_c) - z_c[target])
// and, when dy / dw are given, the gradient (softmax - onehot) * grad_scale written over z_c, then
//   dy_c = dz_c w  (overwrites dy's rows of the chunk)    dw (+)= dz_c^T y_c
// (dw: the first chunk overwrites unless accumulate_dw, later chunks add).
// y [N,d], w [V,d] (same dtype), targets int32 [N], loss_sum 1 element (fp32; fp64 for fp64 y),
// dy [N,d] like y, dw [V,d] (fp32 beside bf16/fp16 y, as in linear_backward). One chunk
// (chunk_rows >= N) is exactly linear + cross_entropy + linear_backward, bitwise.
void linear_cross_entropy(Context& ctx, const Tensor& y, const Tensor& w, const Tensor& targets, Tensor& loss_sum,
                          Tensor* dy, Tensor* dw, bool accumulate_dw, double grad_scale, std::int64_t chunk_rows);

// ---- elementwise and reductions ----------------------------------------------------------------
void fill(Context& ctx, Tensor& x, double value);
// out = a + b (out may alias a or b); all three the same dtype and size.
void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out);
// x *= s
void scale(Context& ctx, Tensor& x, double s);
// dst = src converted (any floating dtypes, same element count). Same dtype = copy.
void cast(Context& ctx, const Tensor& src, Tensor& dst);
// Copies bytes between any two devices (same dtype and count).
void copy(Context& ctx, const Tensor& src, Tensor& dst);
// out (1 element, fp32 on CUDA, fp64 on CPU) = sum of x^2, accumulated in at least fp32.
void sum_squares(Context& ctx, const Tensor& x, Tensor& out);
// flag (1 element int32) = 1 if any element of x is inf or nan, else left unchanged.
void check_finite(Context& ctx, const Tensor& x, Tensor& flag);

// ---- AdamW -----------------------------------------------------------------------------------
// docs/architecture.md §2: p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps), with g = grad * grad_scale
// (grad_scale folds in 1/loss_scale and the clipping factor). param, grad, m, v share a dtype
// (fp32, or fp64 on CPU) and size. When param_lowp is non-null it receives the updated parameter
// in its dtype (the bf16/fp16 working copy), in the same pass.
struct AdamWStep {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  std::int64_t step = 1;   // t, 1-based
  double grad_scale = 1.0;
  // CUDA only, for a step captured as a CUDA graph (train.cuda_graphs, ops/device_step.h): when
  // set, the kernel takes its scalars from device memory instead of the fields above, so a replay
  // uses this step's: `device_scalars` (f32 [kAdamWScalars], adamw_upload_scalars before the step)
  // and `device_clip` (f64 [kClipSlots], clip_grad_scale inside the step: its grad_scale, and no
  // update at all where its norm is not finite).
  const Tensor* device_scalars = nullptr;
  const Tensor* device_clip = nullptr;
  // CUDA only: FP8 GEMM weights in this range cast in the same pass (lmscale/ops/fp8.h,
  // Fp8WeightCast; offsets in param's elements): their param_lowp elements are not written.
  // param_lowp must be given (its dtype is the rounding before the cast). With device_clip, a
  // non-finite norm still casts (the unchanged weights).
  const std::vector<Fp8WeightCast>* fp8_casts = nullptr;
};
void adamw(Context& ctx, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& a,
           Tensor* param_lowp);
// The same update where the gradients lie in separate tensors (one process's lazy gradient
// buckets): pieces[i].grad holds the gradients of elements [pieces[i].offset, + its numel) of
// param, m, v; the pieces are sorted by offset and cover [0, param.numel()) exactly. Results are
// bitwise those of adamw() on each piece. On CUDA one launch per 64 pieces where every piece
// starts and ends on 8-element boundaries with 16-byte aligned tensors (else one per piece):
// xl's 33 buckets took 16.0 ms as 33 launches where one launch over one buffer takes 15.4.
struct GradPiece {
  std::int64_t offset = 0;
  Tensor grad;
};
void adamw_pieces(Context& ctx, Tensor& param, const std::vector<GradPiece>& pieces, Tensor& m, Tensor& v,
                  const AdamWStep& a, Tensor* param_lowp);

}  // namespace lmscale::ops
