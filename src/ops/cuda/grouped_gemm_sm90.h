#pragma once
// lmscale's own grouped GEMM for Hopper (sm_90a): many products of different sizes in one
// persistent launch, on TMA copies and warpgroup MMAs (wgmma), for the MoE experts
// (model.moe_expert_gemm = wgmma, moe_experts_wgmma.cpp). docs/moe.md, "Our grouped GEMM".
//
// Every product is C[m, n] = sum over its segments s of op(A_s) op(B_s), fp32 accumulation, in
// one of three layouts of row-major operands (16-bit elements):
//   nt: A [m, k] and B [n, k]   (C = A B^T: the forward products)
//   nn: A [m, k] and B [k, n]   (C = A B:   the data gradients)
//   tn: A [k, m] and B [k, n]   (C = A^T B: the weight gradients)
// C is row-major [m, n] with row stride ldc, in the inputs' dtype (or fp32 for tn: the weight
// gradients into fp32 master gradients); with `accumulate` the product is added
// to C (in fp32, then rounded to C's dtype). Two segments sum two products in the one fp32
// accumulator (dx = dA W1 + dB W3 of the experts' backward), rounded once.
//
// An operand is a 2-D row-major matrix, or a stack of `count` of them (the experts' weights
// [E, r, c]); a segment names its A and B, the first row of each it reads (the expert's first
// token of the activations) and the matrix of the stack. Rows a product reads past its own
// (the next expert's tokens, for A of nt and nn) only reach rows of C it does not store; for tn
// the rows are the reduction, so each expert's tn operands must be matrices of exactly its rows
// (the copy engine reads zeros past a matrix's end).
//
// Tiles: 128 x 256 of C per CTA (two consumer warpgroups of 64 rows, m64n256k16 wgmma), k in
// steps of 64 through a 4-stage ring of shared memory filled by TMA; one CTA per SM walks the
// tiles of all products (product-major, m fastest).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "lmscale/core/dtype.h"

namespace lmscale::ops::cuda::grouped_sm90 {

enum class Layout { nt, nn, tn };

struct Matrix {
  const void* base = nullptr;
  std::int64_t rows = 0, cols = 0, ld = 0;   // elements
  std::int64_t count = 1, stride = 0;        // a stack: `count` matrices `stride` elements apart
};

struct Segment {
  int a = 0, b = 0;                        // indices into Call::a and Call::b
  std::int64_t a_row = 0, a_matrix = 0;    // A's first row read, and its matrix in the stack
  std::int64_t b_row = 0, b_matrix = 0;
  std::int64_t k = 0;
};

struct Problem {
  std::int64_t m = 0, n = 0;
  void* c = nullptr;
  std::int64_t ldc = 0;
  Segment segments[2];
  int segment_count = 1;
};

struct Call {
  Layout layout = Layout::nt;
  DType in = DType::bf16, out = DType::bf16;   // bf16 or fp16 in; out = in, or fp32 for tn
  bool accumulate = false;                     // C += the product
  std::vector<Matrix> a, b;
  std::vector<Problem> problems;
};

// The device is an sm_90 GPU and this binary holds the kernels (built for sm_90a); asked once.
bool available();
// Whether `call` satisfies the kernel's rules: dtypes above; 16-byte aligned bases and row
// strides (multiples of 8 elements), n even, ldc a multiple of 8, every size below 2^31, and each
// segment's k the extent of its operands along the reduction (the kernel reads k rounded up to
// 64 and relies on zeros past the matrix) unless k is a multiple of 64.
bool supports(const Call& call);
// Queues the products on `stream` (as few launches as the parameter space allows: up to 32
// products and 48 operand maps a launch) and returns the number of launches. `sms`: CTAs per
// launch at most (the SM count, or fewer to leave SMs to collectives).
int run(const Call& call, int sms, cudaStream_t stream);

// ---- shared with the kernel (grouped_gemm_sm90.cu) -----------------------------------------------
inline constexpr int kTileM = 128, kTileN = 256, kTileK = 64;
inline constexpr int kMaxMaps = 48, kMaxProblems = 32;

struct DeviceSegment {
  int a_map, b_map;
  int a_row, a_matrix, b_row, b_matrix;
  int k_tiles;
};
struct DeviceProblem {
  void* c;
  long long ldc;
  int m, n, tiles_m, first_tile, segment_count;
  DeviceSegment segments[2];
};
struct LaunchParams {
  CUtensorMap maps[kMaxMaps];
  DeviceProblem problems[kMaxProblems];
  int problem_count, tile_count, accumulate;
};
void launch(const LaunchParams& p, Layout layout, DType in, DType out, int ctas, cudaStream_t stream);

}  // namespace lmscale::ops::cuda::grouped_sm90
