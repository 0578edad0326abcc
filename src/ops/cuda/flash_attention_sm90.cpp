// Host side of the Hopper attention kernels: can this process run them, and the TMA tensor maps of
// one call (the encoder: tensor_map.h).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "alignment.h"
#include "flash_attention_sm90.h"
#include "tensor_map.h"

namespace lmscale::ops::cuda::attn {

bool sm90_kernels_compiled();   // flash_attention_sm90_fwd.cu: the device code was built for sm_90a

namespace {

TensorMapEncoder encoder() {
  const TensorMapEncoder fn = tensor_map_encoder();
  if (fn == nullptr) throw_error("flash attention (sm90): the driver has no cuTensorMapEncodeTiled");
  return fn;
}

// [batch, heads, seq, head_dim] with the call's strides (elements; q, k, v's, or o and dO's when
// `o_layout`), boxes of `rows` x 64.
CUtensorMap make_map(const void* base, const Params& p, Elem e, int rows, bool o_layout = false) {
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  const cuuint64_t elem = 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(p.head_dim), static_cast<cuuint64_t>(p.seq),
                              static_cast<cuuint64_t>(p.heads), static_cast<cuuint64_t>(p.batch)};
  const long long st = o_layout ? p.o_stride_t : p.stride_t, sh = o_layout ? p.o_stride_h : p.stride_h,
                  sb = o_layout ? p.o_stride_b : p.stride_b;
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(st) * elem, static_cast<cuuint64_t>(sh) * elem,
                                 static_cast<cuuint64_t>(sb) * elem};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(rows), 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      e == Elem::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = encoder()(&map, type, 4, const_cast<void*>(base), dims, strides, box, unit,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw_error("flash attention (sm90): cuTensorMapEncodeTiled failed for this layout");
  return map;
}

}  // namespace

bool sm90_available() {
  static const bool ok = [] {
    // LMSCALE_FLASH_SM90=0 keeps the FlashAttention-2 kernels (for comparisons and bisecting).
    if (const char* env = std::getenv("LMSCALE_FLASH_SM90"); env != nullptr && std::strcmp(env, "0") == 0) return false;
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return false;
    return prop.major == 9 && sm90_kernels_compiled();
  }();
  return ok;
}

bool sm90_layout_ok(const Params& p, Elem e) {
  if (e != Elem::bf16 && e != Elem::f16) return false;
  if (p.head_dim != 64 && p.head_dim != 128) return false;
  // TMA: 16-byte aligned base and strides that are multiples of 16 bytes (8 elements).
  if (p.stride_t % 8 || p.stride_h % 8 || p.stride_b % 8) return false;
  if (p.o_stride_t % 8 || p.o_stride_h % 8 || p.o_stride_b % 8) return false;   // o, dO (TMA for dO too)
  for (const void* ptr : {p.q, p.k, p.v, p.o, p.dout, static_cast<const void*>(p.out), static_cast<const void*>(p.dq),
                          static_cast<const void*>(p.dk), static_cast<const void*>(p.dv)})
    if (ptr != nullptr && !is_aligned16(ptr)) return false;
  return true;
}

TmaMaps make_sm90_fwd_maps(const Params& p, Elem e) {
  TmaMaps m;
  m.q = make_map(p.q, p, e, 128);
  m.k = make_map(p.k, p, e, 128);
  m.v = make_map(p.v, p, e, 128);
  std::memset(&m.dout, 0, sizeof(m.dout));
  return m;
}

TmaMaps make_sm90_bwd_maps(const Params& p, Elem e) {
  TmaMaps m;
  m.q = make_map(p.q, p, e, 64);
  m.k = make_map(p.k, p, e, 128);
  m.v = make_map(p.v, p, e, 128);
  m.dout = make_map(p.dout, p, e, 64, true);
  return m;
}

}  // namespace lmscale::ops::cuda::attn
