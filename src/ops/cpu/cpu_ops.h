#pragma once
// The CPU implementations behind the public ops:: functions (include/lmscale/ops/ops.h): same
// signatures and semantics, called by the dispatchers in src/ops/*.cpp after the shape, dtype and
// device checks. Math ops run in fp32 or fp64 (templates over float/double; GEMMs via OpenBLAS);
// bf16/fp16 are rejected there with a clear error, because mixed precision is CUDA-only. The data
// movers (fill, cast, copy, sum_squares, check_finite, add, scale) also take bf16/fp16, and
// adamw's param_lowp may be any floating dtype; embedding's forward is a byte gather (any dtype).
// Attention has its own header (attention_cpu.h).
#include <cstdint>

#include <vector>

#include "lmscale/ops/fp8.h"
#include "lmscale/ops/ops.h"
#include "lmscale/ops/optimizer_steps.h"

namespace lmscale::ops::cpu {

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

void rope(Context& ctx, Tensor& x, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t Dh, double theta,
          bool inverse, std::int64_t row_stride);

// a, b (da, db) rows of `ld` elements, h and dh contiguous [rows, cols] (ops::swiglu_rows).
void swiglu(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols, std::int64_t ld,
            Tensor& h, Tensor* h_amax);
void swiglu_backward(Context& ctx, const Tensor& a, const Tensor& b, std::int64_t rows, std::int64_t cols,
                     std::int64_t ld, const Tensor& dh, Tensor& da, Tensor& db, Tensor* dab_amax);

void cross_entropy(Context& ctx, const Tensor& logits, const Tensor& targets, Tensor& loss_sum, Tensor* dlogits,
                   double grad_scale);

void fill(Context& ctx, Tensor& x, double value);
void add(Context& ctx, const Tensor& a, const Tensor& b, Tensor& out);
void scale(Context& ctx, Tensor& x, double s);
void cast(Context& ctx, const Tensor& src, Tensor& dst);
void copy(Context& ctx, const Tensor& src, Tensor& dst);   // host to host only
void sum_squares(Context& ctx, const Tensor& x, Tensor& out);
void check_finite(Context& ctx, const Tensor& x, Tensor& flag);

void adamw(Context& ctx, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& a,
           Tensor* param_lowp);
// ops/device_step.h
void clip_grad_scale(Context& ctx, const Tensor& partials, double inv_scale, double max_norm, Tensor& out);

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
                           int margin, Tensor& scale, Tensor& inv_scale);
void cast_transpose_fp8(Context& ctx, const Tensor& x, const Tensor& scale, Tensor* out, Tensor& out_t,
                        const Fp8HistoryUpdate* update);
void transpose_fp8(Context& ctx, const Tensor& x, Tensor& out);
void gather_scalars(Context& ctx, std::initializer_list<const Tensor*> sources, Tensor& out, std::int64_t stride);
void fp8_update_scale(Context& ctx, const Tensor& amax_history, Fp8Format format, int margin, Tensor& scale,
                      Tensor& inv_scale);
void linear_fp8(Context& ctx, const Tensor& a, const Tensor& a_inv, const Tensor& b, const Tensor& b_inv, Tensor& y,
                bool accumulate);

}  // namespace lmscale::ops::cpu
