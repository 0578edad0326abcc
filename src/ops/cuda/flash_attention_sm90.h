#pragma once
// Hopper (sm_90a) FlashAttention kernels (flash_attention_sm90_fwd.cu, flash_attention_sm90_bwd.cu)
// and their TMA tensor maps (flash_attention_sm90.cpp). Internal to ops/cuda; chosen by
// flash_attention.cpp when the device is an sm_90 GPU, the dtype is bf16 or fp16, the head dim is
// 64 or 128 and the layout suits the copy engine (sm90_layout_ok).
#include <cuda.h>

#include "attention_kernels.h"

namespace lmscale::ops::cuda::attn {

// Tensor maps of one call: 4-D views [batch, heads, seq, head_dim] of Q, K, V (and dO for the
// backward) with boxes of `rows` x 64 elements and the 128-byte swizzle.
struct TmaMaps {
  CUtensorMap q, k, v, dout;
};

// True when this process's device can run the sm90 kernels (compute capability 9.x and a binary
// built for sm_90a): queried once per process.
bool sm90_available();
// The tensor maps need 16-byte aligned base pointers and strides that are multiples of 8 elements.
bool sm90_layout_ok(const Params& p, Elem e);
// Forward maps: Q, K, V in boxes of 128 rows. Backward maps: Q and dO in boxes of 64 rows, K and V
// of 128.
TmaMaps make_sm90_fwd_maps(const Params& p, Elem e);
TmaMaps make_sm90_bwd_maps(const Params& p, Elem e);

// O and lse (natural log) of p, as launch_flash_fwd_mma.
void launch_flash_fwd_sm90(const Params& p, Elem e, const TmaMaps& maps, cudaStream_t stream);
// dQ, dK, dV of p. Workspaces over rows padded to whole query tiles, T_pad = sm90_bwd_seq_pad(T):
// p.dq_accum (fp32, B*H*T_pad*head_dim, blocked), p.dsum and p.lse_log2 (fp32 [B*H, T_pad] each). Computes D and lse * log2(e) into the padded rows, zeroes the
// accumulator, adds dQ's shares with atomics, converts it to dQ.
int sm90_bwd_seq_pad(int seq);
void launch_flash_bwd_sm90(const Params& p, Elem e, const TmaMaps& maps, cudaStream_t stream);

// Shared with the FA2 backward (flash_attention_bwd.cu): dQ = scale * dQacc in the input dtype.
void launch_flash_bwd_dq_convert(const Params& p, Elem e, cudaStream_t stream);

}  // namespace lmscale::ops::cuda::attn
