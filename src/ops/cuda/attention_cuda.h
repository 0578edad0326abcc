#pragma once
// CUDA attention entry points behind ops::attention_* (src/ops/attention.cpp). Pointers are
// device memory in the strided layout of ops::AttentionShape; `dtype` is the element type of
// Q, K, V, O and the gradients (f32, bf16 or f16). lse is fp32 [B,H,T]; probs is [B,H,T,T] in
// `dtype`. Work is queued on ctx.stream; temporaries come from ctx.allocator.
#include "lmscale/core/context.h"
#include "lmscale/core/dtype.h"
#include "lmscale/ops/ops.h"

namespace lmscale::ops::cuda {

// Naive: cuBLASLt strided-batched GEMMs (fp32 accumulation) + own softmax kernels (fp32 math).
void attention_naive_forward(Context& ctx, const AttentionShape& s, DType dtype, const void* q, const void* k,
                             const void* v, void* o, void* probs);
void attention_naive_backward(Context& ctx, const AttentionShape& s, DType dtype, const void* q, const void* k,
                              const void* v, const void* probs, const void* dout, void* dq, void* dk, void* dv);

// FlashAttention-2. bf16/fp16 with head_dim a multiple of 8 and 16-byte aligned rows: tensor-core
// kernels (mma.sync m16n8k16, ldmatrix, cp.async); fp32 and the rest: CUDA-core kernels with fp32
// FMAs. head_dim 1 to 256 (attn::kMaxFlashHeadDim); any seq length.
void attention_flash_forward(Context& ctx, const AttentionShape& s, DType dtype, const void* q, const void* k,
                             const void* v, void* o, float* lse);
// Temporaries: D = rowsum(dO*O) (fp32 [B,H,T]); tensor cores: the fp32 dQ accumulator
// [B*H, T, padded head_dim].
void attention_flash_backward(Context& ctx, const AttentionShape& s, DType dtype, const void* q, const void* k,
                              const void* v, const void* o, const float* lse, const void* dout, void* dq, void* dk,
                              void* dv);

}  // namespace lmscale::ops::cuda
