// CUDA FlashAttention-2 entry points (attention_cuda.h): choose the tensor-core kernels
// (bf16/fp16, head_dim a multiple of 8, 16-byte aligned rows; each compiled for a padded head dim,
// attention_kernels.h) or the CUDA-core kernels (fp32, other head dims, or unaligned layouts), and
// allocate the backward's workspaces (D = rowsum(dO*O); the fp32 dQ accumulator of the fused
// tensor-core backward) from the context's allocator.
#include <cstdint>

#include "alignment.h"
#include "attention_cuda.h"
#include "attention_kernels.h"
#include "flash_attention_sm90.h"
#include "lmscale/core/error.h"
#include "resources.h"

namespace lmscale::ops::cuda {

namespace attn {

void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess) throw Error(fmt::format("{}:{}: {} failed: {}", file, line, what, cudaGetErrorString(err)));
}
void throw_unsupported_head_dim(int head_dim) {
  throw Error(fmt::format("flash attention on CUDA: head_dim {} not supported (1 to {})", head_dim, kMaxFlashHeadDim));
}
void throw_error(const char* message) { throw Error(message); }

}  // namespace attn

namespace {

attn::Elem elem_of(DType d) {
  switch (d) {
    case DType::f32: return attn::Elem::f32;
    case DType::bf16: return attn::Elem::bf16;
    case DType::f16: return attn::Elem::f16;
    default: throw Error(fmt::format("CUDA attention: dtype {} not supported (fp32, bf16, fp16)", dtype_name(d)));
  }
}

attn::Params make_params(const AttentionShape& s) {
  LMSCALE_CHECK(s.head_dim >= 1 && s.head_dim <= attn::kMaxFlashHeadDim,
                "flash attention on CUDA: head_dim {} not supported (1 to {}; io/deck_validate.cpp refuses such decks)",
                s.head_dim, attn::kMaxFlashHeadDim);
  LMSCALE_CHECK(s.seq < (1ll << 31) && s.batch * s.heads < (1ll << 31), "flash attention: shape too large");
  attn::Params p;
  p.batch = static_cast<int>(s.batch);
  p.heads = static_cast<int>(s.heads);
  p.seq = static_cast<int>(s.seq);
  p.head_dim = static_cast<int>(s.head_dim);
  p.stride_b = s.stride_b;
  p.stride_h = s.stride_h;
  p.stride_t = s.stride_t;
  p.o_stride_b = s.o_stride_b;
  p.o_stride_h = s.o_stride_h;
  p.o_stride_t = s.o_stride_t;
  p.scale = static_cast<float>(s.softmax_scale());
  p.causal = s.causal;
  return p;
}

// The tensor-core kernels copy rows with 16-byte cp.async: 16-bit types, head dims and strides in
// multiples of 8 elements (both stride sets) and 16-byte aligned base pointers.
bool tensor_core_ok(const AttentionShape& s, DType d, std::initializer_list<const void*> ptrs) {
  if (d != DType::bf16 && d != DType::f16) return false;
  if (s.head_dim % 8 || attn::padded_head_dim(static_cast<int>(s.head_dim)) == 0) return false;
  if (s.stride_b % 8 || s.stride_h % 8 || s.stride_t % 8) return false;
  if (s.o_stride_b % 8 || s.o_stride_h % 8 || s.o_stride_t % 8) return false;
  for (const void* ptr : ptrs)
    if (!is_aligned16(ptr)) return false;
  return true;
}

}  // namespace

void attention_flash_forward(Context& ctx, const AttentionShape& s, DType dtype, const void* q, const void* k,
                             const void* v, void* o, float* lse) {
  attn::Params p = make_params(s);
  p.q = q, p.k = k, p.v = v, p.out = o, p.lse = lse;
  const attn::Elem e = elem_of(dtype);
  if (attn::sm90_layout_ok(p, e) && attn::sm90_available())
    attn::launch_flash_fwd_sm90(p, e, attn::make_sm90_fwd_maps(p, e), stream(ctx));
  else if (tensor_core_ok(s, dtype, {q, k, v, o}))
    attn::launch_flash_fwd_mma(p, e, stream(ctx));
  else
    attn::launch_flash_fwd_simt(p, e, stream(ctx));
}

void attention_flash_backward(Context& ctx, const AttentionShape& s, DType dtype, const void* q, const void* k,
                              const void* v, const void* o, const float* lse, const void* dout, void* dq, void* dk,
                              void* dv) {
  attn::Params p = make_params(s);
  p.q = q, p.k = k, p.v = v, p.o = o, p.dout = dout, p.dq = dq, p.dk = dk, p.dv = dv;
  p.lse = const_cast<float*>(lse);
  const std::size_t rows = static_cast<std::size_t>(s.batch * s.heads * s.seq);
  Allocator& alloc = *ctx.allocator;
  // Workspaces, returned to the (stream-ordered, caching) allocator after the kernels are queued:
  // the next user of these bytes runs on the same stream, after these kernels.
  struct Workspace {
    Allocator& a;
    std::size_t bytes;
    const char* tag;
    void* ptr = nullptr;
    Workspace(Allocator& alloc_, std::size_t bytes_, const char* tag_) : a(alloc_), bytes(bytes_), tag(tag_) {
      ptr = a.allocate(bytes, tag);
    }
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;
    ~Workspace() { a.deallocate(ptr, bytes, tag); }
  };
  const attn::Elem e = elem_of(dtype);
  if (s.deterministic) {
    // No atomics: the FA2 dK/dV kernel without dQ, then a dQ kernel per query tile (tensor cores,
    // head dims 16, 32, 64, 128), or the CUDA-core kernels (no atomics either).
    Workspace dsum(alloc, rows * sizeof(float), "attention_dsum");
    p.dsum = static_cast<float*>(dsum.ptr);
    attn::launch_flash_bwd_dsum(p, e, stream(ctx));
    const int dp = attn::padded_head_dim(static_cast<int>(s.head_dim));
    const bool has_deterministic_mma = dp == 16 || dp == 32 || dp == 64 || dp == 128;
    if (has_deterministic_mma && tensor_core_ok(s, dtype, {q, k, v, o, dout, dq, dk, dv}))
      attn::launch_flash_bwd_mma_variant(p, e, stream(ctx), 1);
    else
      attn::launch_flash_bwd_simt(p, e, stream(ctx));
    return;
  }
  if (attn::sm90_layout_ok(p, e) && attn::sm90_available()) {
    // The Hopper kernel: D and lse * log2(e) in rows padded to whole query tiles, and the blocked
    // fp32 dQ accumulator over the same padded rows [B*H, T_pad, head_dim] (head_dim 64 or 128).
    const std::size_t padded = static_cast<std::size_t>(s.batch * s.heads) * attn::sm90_bwd_seq_pad(p.seq);
    Workspace dsum(alloc, padded * sizeof(float), "attention_dsum");
    Workspace lse2(alloc, padded * sizeof(float), "attention_lse_log2");
    Workspace dq_accum(alloc, padded * static_cast<std::size_t>(s.head_dim) * sizeof(float), "attention_dq_accum");
    p.dsum = static_cast<float*>(dsum.ptr);
    p.lse_log2 = static_cast<float*>(lse2.ptr);
    p.dq_accum = static_cast<float*>(dq_accum.ptr);
    attn::launch_flash_bwd_sm90(p, e, attn::make_sm90_bwd_maps(p, e), stream(ctx));
    return;
  }
  Workspace dsum(alloc, rows * sizeof(float), "attention_dsum");   // D = rowsum(dO*O), fp32 [B,H,T]
  p.dsum = static_cast<float*>(dsum.ptr);
  attn::launch_flash_bwd_dsum(p, e, stream(ctx));
  if (tensor_core_ok(s, dtype, {q, k, v, o, dout, dq, dk, dv})) {
    // fp32 dQ accumulator [B*H, T, padded Dh] for the fused kernel's atomics (2x the size of dQ in
    // bf16 when Dh is one of the padded widths, attention_kernels.h).
    const auto ld_acc = static_cast<std::size_t>(attn::padded_head_dim(static_cast<int>(s.head_dim)));
    Workspace dq_accum(alloc, rows * ld_acc * sizeof(float), "attention_dq_accum");
    p.dq_accum = static_cast<float*>(dq_accum.ptr);
    attn::launch_flash_bwd_mma(p, e, stream(ctx));
  } else {
    attn::launch_flash_bwd_simt(p, e, stream(ctx));
  }
}

}  // namespace lmscale::ops::cuda
