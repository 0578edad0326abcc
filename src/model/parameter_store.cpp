#include "lmscale/model/parameter_store.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "lmscale/core/error.h"
#include "lmscale/core/rng.h"
#include "lmscale/model/param_layout.h"
#include "lmscale/ops/ops.h"

namespace lmscale::model {

std::vector<ParamInfo> parameter_layout(const ModelDims& m) {
  std::vector<ParamInfo> v;
  std::int64_t off = 0;
  auto add = [&](std::string name, Shape shape, ParamInfo::Kind kind, int layer) {
    ParamInfo p;
    p.name = std::move(name);
    p.numel = shape_numel(shape);
    p.full_shape = shape;
    p.shape = std::move(shape);
    p.offset = off;
    p.kind = kind;
    p.layer = layer;
    off += p.numel;
    v.push_back(std::move(p));
  };
  using K = ParamInfo::Kind;
  const std::int64_t d = m.d_model, F = m.d_ff;
  add("token_embeddings.weight", {m.vocab, d}, K::embedding, -1);
  for (int i = 0; i < m.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    add(p + "attn.q_proj.weight", {d, d}, K::linear, i);
    add(p + "attn.k_proj.weight", {d, d}, K::linear, i);
    add(p + "attn.v_proj.weight", {d, d}, K::linear, i);
    add(p + "attn.output_proj.weight", {d, d}, K::linear, i);
    add(p + "ln1.weight", {d}, K::norm, i);
    if (m.is_moe_block(i)) {
      // The router [E,d] and the E experts' SwiGLU weights stacked on a leading expert axis
      // (docs/moe.md): expert e's w1 is experts.w1.weight[e] [Fe,d].
      const std::int64_t E = m.moe_experts, Fe = m.moe_dff;
      add(p + "ffn.router.weight", {E, d}, K::linear, i);
      add(p + "ffn.experts.w1.weight", {E, Fe, d}, K::linear, i);
      add(p + "ffn.experts.w3.weight", {E, Fe, d}, K::linear, i);
      add(p + "ffn.experts.w2.weight", {E, d, Fe}, K::linear, i);
    } else {
      // w3 before w2 (the reference model declares w1, w2, w3): w1 and w3 back to back, so the
      // FFN's a|b is one GEMM each way (model/param_layout.h).
      add(p + "ffn.w1.weight", {F, d}, K::linear, i);
      add(p + "ffn.w3.weight", {F, d}, K::linear, i);
      add(p + "ffn.w2.weight", {d, F}, K::linear, i);
    }
    add(p + "ln2.weight", {d}, K::norm, i);
  }
  add("ln_final.weight", {d}, K::norm, -1);
  add("lm_head.weight", {m.vocab, d}, K::linear, -1);
  const ParamIndex index(m);   // q|k|v and w1|w3: one GEMM each (the gradient buckets keep them whole)
  for (int i = 0; i < static_cast<int>(v.size()); ++i) v[static_cast<std::size_t>(i)].joins_next = index.joins_next(i);
  return v;
}

void initial_values(const ParamInfo& p, std::uint64_t seed, std::int64_t begin, std::int64_t end, double* out) {
  if (p.kind == ParamInfo::Kind::norm) {
    std::fill(out, out + (end - begin), 1.0);
    return;
  }
  double std = 1.0;
  if (p.kind == ParamInfo::Kind::linear) {
    // The full parameter's fan-in/out (a tensor-parallel slice keeps its parameter's law); stacked
    // experts [E, d_out, d_in] have each expert's.
    const Shape& full = p.full_shape.empty() ? p.shape : p.full_shape;
    const std::size_t r = full.size();
    const double d_out = static_cast<double>(full[r - 2]), d_in = static_cast<double>(full[r - 1]);
    std = std::sqrt(2.0 / (d_in + d_out));
  }
  const CounterRng rng(seed, hash_name(p.name));
  for (std::int64_t i = begin; i < end; ++i) out[i - begin] = rng.truncated_normal(static_cast<std::uint64_t>(i), std, 3.0);
}

namespace {

// Host staging of a store without the whole master: fp32 values cast on the host into the
// working copy's dtype (ops::cast on the host rounds to nearest even, as the device's cast), then
// copied up. Pageable host memory, outside the device's allocator; a copy from it returns once the
// bytes are staged, so the next chunk may reuse it.
class HostStaging {
 public:
  HostStaging(std::int64_t n, DType lowp)
      : f32_(Tensor::empty({std::max<std::int64_t>(n, 1)}, DType::f32, alloc_, "init_staging")),
        low_(Tensor::empty({std::max<std::int64_t>(n, 1)}, lowp, alloc_, "init_staging")) {
    host_.device = Device::cpu;
    host_.allocator = &alloc_;
    host_.host = &alloc_;
  }
  std::int64_t capacity() const { return f32_.numel(); }
  Context& host_ctx() { return host_; }
  Tensor fp32(std::int64_t n) { return f32_.flat_range(0, n); }
  // The first n fp32 values cast into dst [n] (any device).
  void cast_to(std::int64_t n, Tensor dst, Context& ctx) {
    Tensor low = low_.flat_range(0, n);
    ops::cast(host_, f32_.flat_range(0, n), low);
    ops::copy(ctx, low, dst);
  }

 private:
  HostAllocator alloc_;
  Context host_;
  Tensor f32_, low_;
};

constexpr std::int64_t kStagingElements = std::int64_t{1} << 24;   // 64 MiB of fp32

}  // namespace

ParameterStore::ParameterStore(const ModelDims& dims, DType master, DType lowp, Allocator& alloc, Buffers buffers,
                               const TensorSplit& split, std::vector<StageUnits> chunks, const ExpertSplit& experts,
                               MasterCopy master_copy)
    : infos_(expert_parallel_layout(tensor_parallel_layout(dims, split), dims, experts)), chunks_(std::move(chunks)),
      split_(split), experts_(experts), master_(master),
      lowp_dtype_(lowp),
      has_flat_params_(buffers != Buffers::none), has_flat_grads_(buffers == Buffers::params_and_grads) {
  if (chunks_.empty()) chunks_ = {StageUnits::all()};
  const int all = static_cast<int>(infos_.size());
  local_of_.assign(static_cast<std::size_t>(all), -1);
  if (chunks_.size() == 1 && chunks_[0].is_all(dims)) {
    for (int i = 0; i < all; ++i) local_of_[static_cast<std::size_t>(i)] = i;
    global_of_ = local_of_;
  } else {
    // A pipeline stage: its chunks' contiguous slices of the layout, one after the other, with
    // offsets from the start of this store's buffer. Under tensor parallelism too (tp x pp): the
    // layout is then this tp rank's (local shapes), so the stage holds its units' slices.
    std::vector<ParamInfo> mine;
    std::int64_t off = 0;
    for (const StageUnits& u : chunks_) {
      const int lo = u.first_param(dims), hi = u.end_param(dims);
      LMSCALE_CHECK(lo < hi && hi <= all, "stage units [{}, {}) hold no parameters", u.first, u.end_unit(dims));
      for (int i = lo; i < hi; ++i) {
        LMSCALE_CHECK(local_of_[static_cast<std::size_t>(i)] < 0, "pipeline chunks overlap at {}", infos_[static_cast<std::size_t>(i)].name);
        local_of_[static_cast<std::size_t>(i)] = static_cast<int>(mine.size());
        global_of_.push_back(i);
        ParamInfo p = infos_[static_cast<std::size_t>(i)];
        p.offset = off;
        off += p.numel;
        mine.push_back(std::move(p));
      }
    }
    infos_ = std::move(mine);
  }
  total_ = infos_.back().offset + infos_.back().numel;
  has_lowp_ = lowp != master && has_flat_params_;
  // Without a working copy the master is the compute weight: nothing to leave out.
  whole_master_ = master_copy == MasterCopy::whole || !has_lowp_;
  if (!whole_master_) {
    std::int64_t at = 0;
    for (const ParamInfo& p : infos_) {
      packed_at_.push_back(reads_master(p) ? at : -1);
      if (reads_master(p)) at += p.numel;
    }
  }
  if (has_flat_params_) params_ = Tensor::empty({whole_master_ ? total_ : master_read_numel()}, master, alloc, "parameters");
  if (has_flat_grads_) grads_ = Tensor::empty({total_}, master, alloc, "gradients");
  if (has_lowp_) lowp_ = Tensor::empty({total_}, lowp, alloc, "parameters_lowp");
}

Tensor& ParameterStore::flat_params() {
  LMSCALE_CHECK(has_flat_params_, "this parameter store holds no flat parameters (FSDP keeps shards)");
  LMSCALE_CHECK(whole_master_, "this parameter store holds the fp32 master of the master-read ranges only (the rest "
                               "is with the offloaded optimizer): use master_view() or the strategy's master");
  return params_;
}

Tensor& ParameterStore::packed_master_reads() {
  LMSCALE_CHECK(has_flat_params_ && !whole_master_, "packed_master_reads(): this store holds the whole master");
  return params_;
}

std::int64_t ParameterStore::master_read_numel() const {
  std::int64_t n = 0;
  for (const auto& r : master_read_ranges()) n += r.second;
  return n;
}

Tensor ParameterStore::master_view(std::int64_t offset, std::int64_t n) const {
  LMSCALE_CHECK(has_flat_params_, "master_view(): this store holds no flat parameters (FSDP keeps shards)");
  LMSCALE_CHECK(offset >= 0 && n >= 0 && offset + n <= total_, "master_view({}, {}) outside {} elements", offset, n, total_);
  if (whole_master_) return params_.flat_range(offset, n);
  if (n == 0) return params_.flat_range(0, 0);
  // The packed parameter holding `offset`; the range must continue through adjacent held ones.
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    const ParamInfo& p = infos_[i];
    if (offset < p.offset || offset >= p.offset + p.numel ) continue;
    LMSCALE_CHECK(packed_at_[i] >= 0, "master_view({}, {}): {} is not read from the master; its fp32 master is with "
                                      "the offloaded optimizer", offset, n, p.name);
    std::int64_t held = p.offset + p.numel;
    for (std::size_t j = i + 1; j < infos_.size() && held < offset + n && packed_at_[j] >= 0 && infos_[j].offset == held; ++j)
      held += infos_[j].numel;
    LMSCALE_CHECK(offset + n <= held, "master_view({}, {}) leaves the master-read ranges at {}", offset, n, held);
    return params_.flat_range(packed_at_[i] + offset - p.offset, n);
  }
  throw Error(fmt::format("master_view({}, {}): no parameter there", offset, n));
}

Tensor ParameterStore::param(int i) const {
  LMSCALE_CHECK(has_flat_params_, "parameter {}: this store holds no flat parameters (FSDP keeps shards)",
                infos_[static_cast<std::size_t>(i)].name);
  if (whole_master_) return view(params_, i);
  const ParamInfo& p = infos_[static_cast<std::size_t>(i)];
  LMSCALE_CHECK(packed_at_[static_cast<std::size_t>(i)] >= 0,
                "parameter {}: its fp32 master is with the offloaded optimizer, not in the store", p.name);
  return params_.flat_range(packed_at_[static_cast<std::size_t>(i)], p.numel).reshape(p.shape);
}

const StageUnits& ParameterStore::units() const {
  LMSCALE_CHECK(chunks_.size() == 1, "units(): this store holds {} pipeline chunks", chunks_.size());
  return chunks_.front();
}

int ParameterStore::local_index(int global) const {
  const int i = global >= 0 && global < static_cast<int>(local_of_.size()) ? local_of_[static_cast<std::size_t>(global)] : -1;
  LMSCALE_CHECK(i >= 0, "parameter {} of the full model is not held by this store (pipeline stage)", global);
  return i;
}

int ParameterStore::index(const std::string& name) const {
  for (std::size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].name == name) return static_cast<int>(i);
  throw Error("no parameter named '" + name + "'");
}

Tensor ParameterStore::view(const Tensor& flat, int i) const {
  LMSCALE_CHECK(i >= 0 && i < size(), "parameter index {} outside this store's {} parameters (a pipeline stage "
                "holds only its units')", i, size());
  const ParamInfo& p = infos_[static_cast<std::size_t>(i)];
  return flat.flat_range(p.offset, p.numel).reshape(p.shape);
}

Tensor ParameterStore::compute_weight(int i) const {
  if (!has_flat_params_) {
    LMSCALE_CHECK(static_cast<bool>(weights_), "weight {} requested but no weight provider is set",
                  infos_[static_cast<std::size_t>(i)].name);
    return weights_(i);
  }
  if (!reads_master(infos_[static_cast<std::size_t>(i)])) return view(lowp_, i);
  return param(i);
}

ops::Fp8Weight ParameterStore::fp8_weight(int i) const {
  LMSCALE_CHECK(static_cast<bool>(fp8_weights_), "weight {} requested in FP8 but no FP8 weight provider is set",
                infos_[static_cast<std::size_t>(i)].name);
  return fp8_weights_(i);
}

bool ParameterStore::reads_master(const ParamInfo& p) const {
  return !has_lowp_ || p.kind == ParamInfo::Kind::norm;   // norm weights stay in full precision
}

std::vector<std::pair<std::int64_t, std::int64_t>> ParameterStore::master_read_ranges() const {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  if (!has_lowp_) return out;
  for (const auto& p : infos_)
    if (reads_master(p)) out.emplace_back(p.offset, p.numel);
  std::sort(out.begin(), out.end());
  return out;
}

void fill_initial_values(const ParamInfo& p, std::uint64_t seed, std::int64_t begin, std::int64_t end, Tensor dst,
                         Context& ctx) {
  LMSCALE_CHECK(dst.numel() == end - begin, "fill_initial_values: {} elements for [{}, {})", dst.numel(), begin, end);
  // Values are computed on the host in fp64 by several threads (the range split into chunks),
  // converted to dst's dtype and copied in pieces of <= 64 Mi elements so the host staging
  // buffer stays small.
  const std::int64_t chunk = std::min<std::int64_t>(std::int64_t{1} << 26, std::max<std::int64_t>(end - begin, 1));
  HostAllocator staging_alloc;
  Tensor staging64 = Tensor::empty({chunk}, DType::f64, staging_alloc, "init_staging");
  Tensor staging = dst.dtype() == DType::f64 ? staging64 : Tensor::empty({chunk}, dst.dtype(), staging_alloc, "init_staging");
  const unsigned nthreads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  Context host_ctx;
  host_ctx.device = Device::cpu;
  host_ctx.allocator = &staging_alloc;
  host_ctx.host = &staging_alloc;
  for (std::int64_t b = begin; b < end; b += chunk) {
    const std::int64_t n = std::min(chunk, end - b);
    double* out = staging64.data_as<double>();
    std::vector<std::thread> workers;
    const std::int64_t per = (n + nthreads - 1) / nthreads;
    for (unsigned t = 0; t < nthreads; ++t) {
      const std::int64_t lo = t * per, hi = std::min(n, lo + per);
      if (lo >= hi) break;
      workers.emplace_back([&, lo, hi] { initial_values(p, seed, b + lo, b + hi, out + lo); });
    }
    for (auto& w : workers) w.join();
    Tensor src64 = staging64.flat_range(0, n);
    Tensor src = staging.flat_range(0, n);
    if (staging.dtype() != DType::f64) ops::cast(host_ctx, src64, src);
    Tensor part = dst.flat_range(b - begin, n);
    // A copy from pageable host memory returns once the source bytes are staged, so reusing
    // the staging buffer for the next chunk is safe.
    ops::copy(ctx, src, part);
  }
}

void ParameterStore::init(std::uint64_t seed, Context& ctx) {
  if (!has_flat_params_) return;
  seed_ = seed;
  if (whole_master_) {
    for (const ParamInfo& p : infos_) fill_slice_initial_values(p, seed, params_.flat_range(p.offset, p.numel), ctx);
  } else {
    // The held ranges directly; the working copy of the others cast from their fp32 values on
    // the host (round to nearest even, the device cast's rounding: what refresh_lowp of a whole
    // master writes), so no device memory beyond the store's is allocated.
    HostStaging staging(std::min(kStagingElements, total_), lowp_.dtype());
    for (std::size_t i = 0; i < infos_.size(); ++i) {
      const ParamInfo& p = infos_[i];
      if (packed_at_[i] >= 0) {
        fill_slice_initial_values(p, seed, params_.flat_range(packed_at_[i], p.numel), ctx);
        continue;
      }
      for (std::int64_t a = 0; a < p.numel; a += staging.capacity()) {
        const std::int64_t n = std::min(staging.capacity(), p.numel - a);
        fill_slice_initial_values(p, seed, a, a + n, staging.fp32(n), staging.host_ctx());
        staging.cast_to(n, lowp_.flat_range(p.offset + a, n), ctx);
      }
    }
  }
  zero_grads(ctx);
  refresh_lowp(ctx);
}

void ParameterStore::initial_master(std::int64_t begin, std::int64_t end, Tensor dst, Context& ctx) const {
  LMSCALE_CHECK(seed_.has_value(), "initial_master(): the store was not initialised (init)");
  LMSCALE_CHECK(0 <= begin && begin <= end && end <= total_ && dst.numel() == end - begin,
                "initial_master: [{}, {}) of {} into {} elements", begin, end, total_, dst.numel());
  for (const ParamInfo& p : infos_) {
    const std::int64_t a = std::max(begin, p.offset), b = std::min(end, p.offset + p.numel);
    if (a < b) fill_slice_initial_values(p, *seed_, a - p.offset, b - p.offset, dst.flat_range(a - begin, b - a), ctx);
  }
}

void ParameterStore::write_master(Context& ctx, const Tensor& src) {
  LMSCALE_CHECK(src.numel() == total_ && src.dtype() == master_, "write_master: {} values of {} for {} of {}",
                src.numel(), dtype_name(src.dtype()), total_, dtype_name(master_));
  if (whole_master_) {
    ops::copy(ctx, src, params_);
    refresh_lowp(ctx);
    return;
  }
  for (const auto& [offset, numel] : master_read_ranges()) {
    Tensor dst = master_view(offset, numel);
    ops::copy(ctx, src.flat_range(offset, numel), dst);
  }
  // The working copy of everything, cast on the host as init() casts.
  HostStaging staging(std::min(kStagingElements, total_), lowp_.dtype());
  for (std::int64_t a = 0; a < total_; a += staging.capacity()) {
    const std::int64_t n = std::min(staging.capacity(), total_ - a);
    Tensor t = staging.fp32(n);
    ops::copy(ctx, src.flat_range(a, n), t);
    staging.cast_to(n, lowp_.flat_range(a, n), ctx);
  }
}

void ParameterStore::zero_grads(Context& ctx) {
  if (has_flat_grads_) ops::fill(ctx, grads_, 0.0);
}

Tensor& ParameterStore::flat_grads() {
  LMSCALE_CHECK(has_flat_grads_, "this parameter store has no flat gradient buffer (ZeRO-2 keeps gradients per bucket)");
  return grads_;
}

Tensor ParameterStore::grad(int i) const {
  if (!has_flat_grads_) {
    LMSCALE_CHECK(static_cast<bool>(provider_), "gradient {} requested but no gradient provider is set",
                  infos_[static_cast<std::size_t>(i)].name);
    return provider_(i);
  }
  return view(grads_, i);
}

void ParameterStore::refresh_lowp(Context& ctx) {
  if (!has_lowp_) return;
  if (whole_master_) return ops::cast(ctx, params_, lowp_);
  for (const auto& [offset, numel] : master_read_ranges()) {
    Tensor dst = lowp_.flat_range(offset, numel);
    ops::cast(ctx, master_view(offset, numel), dst);
  }
}

}  // namespace lmscale::model
