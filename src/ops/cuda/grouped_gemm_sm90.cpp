// Host side of the grouped GEMM for Hopper (grouped_gemm_sm90.h): the rules a call must keep, its
// TMA tensor maps, and its products packed into as few launches as the parameter space holds.
#include "grouped_gemm_sm90.h"

#include <cstring>
#include <limits>

#include "alignment.h"
#include "lmscale/core/error.h"
#include "tensor_map.h"

namespace lmscale::ops::cuda {
namespace attn {
bool sm90_kernels_compiled();   // flash_attention_sm90_fwd.cu: this binary holds sm_90a device code
}

namespace grouped_sm90 {

namespace {

constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();

// Box rows of an operand's tensor map: K-major tiles are [rows of the tile] x 64 elements of k,
// M/N-major ones 64 x 64 boxes (64 rows of k, 64 elements of m or n), one per column block.
int box_rows(Layout layout, bool is_a) {
  const bool mn_major = is_a ? layout == Layout::tn : layout != Layout::nt;
  return mn_major ? 64 : (is_a ? kTileM : kTileN);
}

// A 3-D map [count, rows, cols] of a (stack of) row-major matrices, 128-byte swizzled boxes of
// [1, rows_box, 64]; reads past the ends give zeros.
CUtensorMap encode(const Matrix& m, DType t, int rows_box) {
  const TensorMapEncoder encoder = tensor_map_encoder();
  LMSCALE_CHECK(encoder != nullptr, "grouped GEMM (sm90): the CUDA driver has no cuTensorMapEncodeTiled");
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  const cuuint64_t es = dtype_size(t);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(m.cols), static_cast<cuuint64_t>(m.rows),
                              static_cast<cuuint64_t>(m.count)};
  const cuuint64_t matrix_stride = m.count > 1 ? static_cast<cuuint64_t>(m.stride) : static_cast<cuuint64_t>(m.rows * m.ld);
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(m.ld) * es, matrix_stride * es};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(rows_box), 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUtensorMapDataType type = t == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = encoder(&map, type, 3, const_cast<void*>(m.base), dims, strides, box, unit,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  LMSCALE_CHECK(r == CUDA_SUCCESS, "grouped GEMM (sm90): cuTensorMapEncodeTiled failed ({}) for a [{}, {}, {}] operand",
                static_cast<int>(r), m.count, m.rows, m.cols);
  return map;
}

bool matrix_ok(const Matrix& m) {
  return m.base != nullptr && is_aligned16(m.base) && m.rows > 0 && m.cols > 0 && m.count > 0 && m.ld >= m.cols &&
         m.ld % 8 == 0 && m.stride % 8 == 0 && m.rows <= kIntMax && m.cols <= kIntMax && m.count <= kIntMax &&
         (m.count == 1 || m.stride >= m.rows * m.ld);
}

// Products packed into launches: maps are encoded once per launch and operand.
class Packer {
 public:
  Packer(const Call& call, int sms, cudaStream_t stream)
      : call_(call), sms_(sms), stream_(stream), a_map_(call.a.size(), -1), b_map_(call.b.size(), -1) {
    reset();
  }

  void add(const Problem& pr) {
    int need = 0;
    for (int i = 0; i < pr.segment_count; ++i) {
      const Segment& s = pr.segments[i];
      need += (a_map_[s.a] < 0) + (b_map_[s.b] < 0);
    }
    if (p_.problem_count == kMaxProblems || maps_ + need > kMaxMaps) flush();
    DeviceProblem& d = p_.problems[p_.problem_count++];
    d.c = pr.c;
    d.ldc = pr.ldc;
    d.m = static_cast<int>(pr.m), d.n = static_cast<int>(pr.n);
    d.tiles_m = static_cast<int>((pr.m + kTileM - 1) / kTileM);
    d.first_tile = p_.tile_count;
    d.segment_count = pr.segment_count;
    for (int i = 0; i < pr.segment_count; ++i) {
      const Segment& s = pr.segments[i];
      d.segments[i] = {map(s.a, true), map(s.b, false), static_cast<int>(s.a_row), static_cast<int>(s.a_matrix),
                       static_cast<int>(s.b_row), static_cast<int>(s.b_matrix),
                       static_cast<int>((s.k + kTileK - 1) / kTileK)};
    }
    const std::int64_t tiles = static_cast<std::int64_t>(d.tiles_m) * ((pr.n + kTileN - 1) / kTileN);
    LMSCALE_CHECK(p_.tile_count + tiles <= kIntMax, "grouped GEMM (sm90): more than 2^31 tiles in one launch");
    p_.tile_count += static_cast<int>(tiles);
  }

  int launches() const { return launches_; }

  void flush() {
    if (p_.tile_count > 0) {
      ++launches_;
      const int ctas = p_.tile_count < sms_ ? p_.tile_count : sms_;   // one CTA per SM at most
      launch(p_, call_.layout, call_.in, call_.out, ctas, stream_);
    }
    reset();
  }

 private:
  int map(int operand, bool is_a) {
    int& slot = (is_a ? a_map_ : b_map_)[static_cast<std::size_t>(operand)];
    if (slot < 0) {
      const Matrix& m = (is_a ? call_.a : call_.b)[static_cast<std::size_t>(operand)];
      p_.maps[maps_] = encode(m, call_.in, box_rows(call_.layout, is_a));
      slot = maps_++;
    }
    return slot;
  }
  void reset() {
    std::memset(&p_, 0, sizeof(p_));
    p_.accumulate = call_.accumulate ? 1 : 0;
    maps_ = 0;
    std::fill(a_map_.begin(), a_map_.end(), -1);
    std::fill(b_map_.begin(), b_map_.end(), -1);
  }

  const Call& call_;
  int sms_;
  cudaStream_t stream_;
  LaunchParams p_;
  int maps_ = 0;
  int launches_ = 0;
  std::vector<int> a_map_, b_map_;   // operand -> its map in this launch, or -1
};

}  // namespace

bool available() {
  static const bool ok = [] {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return false;
    return prop.major == 9 && attn::sm90_kernels_compiled() && tensor_map_encoder() != nullptr;
  }();
  return ok;
}

bool supports(const Call& call) {
  if (call.in != DType::bf16 && call.in != DType::f16) return false;
  if (!(call.out == call.in || (call.out == DType::f32 && call.layout == Layout::tn))) return false;
  for (const auto* list : {&call.a, &call.b})
    for (const Matrix& m : *list)
      if (!matrix_ok(m)) return false;
  for (const Problem& pr : call.problems) {
    if (pr.m < 0 || pr.n < 0 || pr.m > kIntMax || pr.n > kIntMax || pr.segment_count < 1 || pr.segment_count > 2)
      return false;
    if (pr.m == 0 || pr.n == 0) continue;
    if (pr.c == nullptr || !is_aligned16(pr.c) || pr.n % 2 != 0 || pr.ldc < pr.n || pr.ldc % 8 != 0) return false;
    for (int i = 0; i < pr.segment_count; ++i) {
      const Segment& s = pr.segments[i];
      if (s.a < 0 || s.b < 0 || s.a >= static_cast<int>(call.a.size()) || s.b >= static_cast<int>(call.b.size()))
        return false;
      if (s.k < 0 || s.k > kIntMax || s.a_row < 0 || s.a_row > kIntMax || s.b_row < 0 || s.b_row > kIntMax) return false;
      const Matrix& a = call.a[static_cast<std::size_t>(s.a)];
      const Matrix& b = call.b[static_cast<std::size_t>(s.b)];
      if (s.a_matrix < 0 || s.a_matrix >= a.count || s.b_matrix < 0 || s.b_matrix >= b.count) return false;
      // The reduction's extent in each operand: K-major ones hold k in their columns, M/N-major
      // ones in their rows from the segment's first.
      const std::int64_t a_k = call.layout == Layout::tn ? a.rows - s.a_row : a.cols;
      const std::int64_t b_k = call.layout == Layout::nt ? b.cols : b.rows - s.b_row;
      for (const std::int64_t extent : {a_k, b_k})
        if (extent != s.k && !(s.k % kTileK == 0 && extent >= s.k)) return false;
    }
  }
  return true;
}

int run(const Call& call, int sms, cudaStream_t stream) {
  LMSCALE_CHECK(supports(call), "grouped GEMM (sm90): the call breaks the kernel's rules (grouped_gemm_sm90.h)");
  Packer packer(call, sms > 0 ? sms : 1, stream);
  for (const Problem& pr : call.problems)
    if (pr.m > 0 && pr.n > 0) packer.add(pr);
  packer.flush();
  return packer.launches();
}

}  // namespace grouped_sm90
}  // namespace lmscale::ops::cuda
