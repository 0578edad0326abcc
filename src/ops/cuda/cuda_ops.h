#pragma once
// The CUDA implementations behind the public ops (include/lmscale/ops/ops.h), same signatures and
// semantics. The public functions in src/ops/*.cpp check shapes and dtypes and call these when the
// tensors are on Device::cuda; these re-check only what the kernels rely on (dtype combinations,
// alignment). All work is queued on the context's compute stream; nothing synchronises except
// copies into host memory. Supported dtypes: fp32, bf16, fp16 (fp32 accumulation everywhere).
#include <cstdint>

#include <vector>

#include "lmscale/ops/fp8.h"
#include "lmscale/ops/ops.h"
#include "lmscale/ops/optimizer_steps.h"

namespace lmscale::ops::cuda {

void linear(Context& ctx, const Tensor& x, const Tensor& w, Tensor& y);
void linear_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw,
                     bool accumulate_dw);
void linear_group(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, const std::vector<Tensor>& ys);
void linear_group_backward(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws,
                           const std::vector<Tensor>& dys, Tensor* dx, const std::vector<Tensor>* dws,
                           bool accumulate_dw);
// ops::linear_side_by_side's products when the weights do not lie back to back: y [M, n*R] gets
// x ws[i]^T in its columns [i*R, (i+1)*R) (row stride n*R); the backward reads dy's column blocks
// the same way: dx = sum_i dy_i ws[i] (later products added in the GEMM epilogue), dws[i] (+)= dy_i^T x.
void linear_columns(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, Tensor& y);
void linear_columns_backward(Context& ctx, const Tensor& x, const std::vector<Tensor>& ws, const Tensor& dy,
                             Tensor* dx, const std::vector<Tensor>* dws, bool accumulate_dw);

void embedding(Context& ctx, const Tensor& ids, const Tensor& table, Tensor& out);
void embedding_backward(Context& ctx, const Tensor& ids, const Tensor& dout, Tensor& dtable);

void rmsnorm(Context& ctx, const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd,
             Tensor* y_amax);
void rmsnorm_backward(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                      Tensor& dx, Tensor& dw, bool accumulate_dx, Tensor* dx_amax);
void add_rmsnorm(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& w, double eps, Tensor& sum, Tensor& y,
                 Tensor& rstd, Tensor* y_amax);

void rope(Context& ctx, Tensor& x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t Dh, double theta,
          bool inverse, std::int64_t row_stride);

// a, b (da, db) rows of `ld` elements, h and dh contiguous [rows, cols] (ops::swiglu_rows).
void swiglu(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols, std::int64_t ld,
            Tensor& h, Tensor* h_amax);
// ops::moe_experts and its backward as grouped GEMMs (model.moe_expert_gemm = grouped;
// moe_experts_grouped.cpp); shapes checked by the caller.
void moe_experts_grouped(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                         const Tensor& W3, const Tensor& W2, Tensor& a, Tensor& b, Tensor& g, Tensor& y);
void moe_experts_grouped_backward(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows,
                                  const Tensor& W1, const Tensor& W3, const Tensor& W2, const Tensor& a,
                                  const Tensor& b, const Tensor& g, const Tensor& dy, Tensor& dg, Tensor& da,
                                  Tensor& db, Tensor& dx, Tensor& G1, Tensor& G3, Tensor& G2, bool accumulate);
// ops::moe_experts and its backward on lmscale's own grouped GEMM for Hopper
// (model.moe_expert_gemm = wgmma; moe_experts_wgmma.cpp), where moe_experts_wgmma_supported:
// an sm_90 device, 16-bit activations (every tensor of `same_dtype`), weight gradients in their
// dtype or fp32, rows of a multiple of 8 elements, 16-byte aligned data. Shapes checked by the caller.
bool moe_experts_wgmma_supported(const Tensor& x, const std::vector<const Tensor*>& same_dtype,
                                 const std::vector<const Tensor*>& gradients);
void moe_experts_wgmma(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                       const Tensor& W3, const Tensor& W2, Tensor& a, Tensor& b, Tensor& g, Tensor& y);
void moe_experts_wgmma_backward(Context& ctx, const Tensor& x, const std::vector<std::int64_t>& rows, const Tensor& W1,
                                const Tensor& W3, const Tensor& W2, const Tensor& a, const Tensor& b, const Tensor& g,
                                const Tensor& dy, Tensor& dg, Tensor& da, Tensor& db, Tensor& dx, Tensor& G1,
                                Tensor& G3, Tensor& G2, bool accumulate);
void swiglu_backward(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols,
                     std::int64_t ld, const Tensor& dh, Tensor& da, Tensor& db, Tensor* dab_amax);

void cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, Tensor& loss_sum, Tensor* dlogits,
                   double grad_scale);

void fill(Context& ctx, Tensor& x, double value);
void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out);
void scale(Context& ctx, Tensor& x, double s);
void cast(Context& ctx, const Tensor& src, Tensor& dst);
// Either side may be on the host; a copy into host memory waits for the stream before returning.
void copy(Context& ctx, const Tensor& src, Tensor& dst);
void sum_squares(Context& ctx, const Tensor& x, Tensor& out);
void check_finite(Context& ctx, const Tensor& x, Tensor& flag);

void adamw(Context& ctx, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& a,
           Tensor* param_lowp);
// ops/device_step.h
void clip_grad_scale(Context& ctx, const Tensor& partials, double inv_scale, double max_norm, Tensor& out);
void adamw_upload_scalars(Context& ctx, const AdamWStep& a, Tensor& scalars);
// ops::adamw_pieces in as few launches as the layout allows; false (nothing done) when it does
// not (a piece off the 8-element grid, a misaligned tensor, or not fp32): the caller runs adamw()
// per piece.
bool adamw_pieces(Context& ctx, Tensor& param, const std::vector<GradPiece>& pieces, Tensor& m, Tensor& v,
                  const AdamWStep& a, Tensor* param_lowp);
// AdamW with a.fp8_casts (lmscale/ops/fp8.h, Fp8WeightCast) over the whole of param, its gradients
// one tensor or pieces; throws where the layout does not allow it (adamw_fp8.cu).
struct GradSource {
  const Tensor* one = nullptr;
  const std::vector<GradPiece>* pieces = nullptr;
};
void adamw_fp8(Context& ctx, Tensor& param, const GradSource& grads, Tensor& m, Tensor& v, const AdamWStep& a,
               Tensor& param_lowp);
void fp8_weight_casts(Context& ctx, const Tensor& param, DType rounding, const std::vector<Fp8WeightCast>& casts);
void fp8_weight_casts_begin(Context& ctx, const std::vector<Fp8WeightCast>& casts, bool commit);

// Momentum SGD, LAMB and the trust-ratio norms (lmscale/ops/optimizer_steps.h).
void momentum_update(Context& ctx, Tensor& param, const Tensor& grad, Tensor& buf, const MomentumStep& s,
                     Tensor* param_lowp);
void lamb_moments(Context& ctx, const Tensor& grad, Tensor& m, Tensor& v, const LambStep& s);
void lamb_update(Context& ctx, Tensor& param, const Tensor& m, const Tensor& v, const LambStep& s, Tensor* param_lowp);
std::vector<double> lars_norms(Context& ctx, const Tensor& param, const Tensor& grad, double grad_scale,
                               const std::vector<Span>& spans);
std::vector<double> lamb_norms(Context& ctx, const Tensor& param, const Tensor& m, const Tensor& v, const LambStep& s,
                               const std::vector<Span>& spans);

// Vocabulary-parallel embedding and cross-entropy (lmscale/ops/vocab_parallel.h).
void embedding_shard(Context& ctx, const Tensor& ids, const Tensor& table, std::int64_t vocab_begin, Tensor& out);
void embedding_shard_backward(Context& ctx, const Tensor& ids, const Tensor& dout, std::int64_t vocab_begin,
                              Tensor& dtable);
void vocab_parallel_max(Context& ctx, const Tensor& logits, Tensor& row_max);
void vocab_parallel_sums(Context& ctx, const Tensor& logits, const Tensor& targets, std::int64_t vocab_begin,
                         const Tensor& row_max, Tensor& sums);
void vocab_parallel_loss(Context& ctx, const Tensor& logits, const Tensor& targets, std::int64_t vocab_begin,
                         const Tensor& row_max, const Tensor& sums, Tensor& loss_sum, Tensor* dlogits,
                         double grad_scale);

// FP8 scaling, cast, transpose and GEMM (lmscale/ops/fp8.h).
void amax(Context& ctx, const Tensor& x, Tensor& out);
void cast_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor& out, Tensor* amax_out,
              const Fp8HistoryUpdate* update);
void fp8_amax_update_scale(Context& ctx, const Tensor& x, Tensor& amax_history, std::int64_t slot, Fp8Format format,
                           int margin, Tensor& scale, Tensor& inv_scale, Tensor& work);
void cast_transpose_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor* out, Tensor& out_t,
                        const Fp8HistoryUpdate* update);
void transpose_fp8(Context& ctx, const Tensor& x, Tensor& out);
void gather_scalars(Context& ctx, std::initializer_list<const Tensor*> sources, Tensor& out, std::int64_t stride);
void fp8_update_scale(Context& ctx, const Tensor& amax_history, Fp8Format format, int margin, Tensor& scale,
                      Tensor& inv_scale);
void linear_fp8(Context& ctx, const Tensor& a, const Tensor& a_inv, const Tensor& b, const Tensor& b_inv, Tensor& y,
                bool accumulate, Fp8Accumulation accumulation);
// The casts fused into SwiGLU (fp8_producers.cu): false, with nothing launched, where the shapes
// or alignments leave the 8-wide kernel out (the caller composes the plain ops instead).
bool swiglu_cast_transpose_fp8(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols,
                               std::int64_t ld, const Tensor& scale, Tensor* out, Tensor& out_t,
                               const Fp8HistoryUpdate* update);
bool swiglu_backward_cast_transpose_fp8(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows,
                                        std::int64_t cols, std::int64_t ld, const Tensor& dh, const Tensor& scale,
                                        Tensor* out, Tensor& out_t, const Fp8HistoryUpdate* update);

}  // namespace lmscale::ops::cuda
