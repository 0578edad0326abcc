#include "lmscale/model/parameter_store.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "lmscale/core/error.h"
#include "lmscale/core/rng.h"
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
      add(p + "ffn.experts.w2.weight", {E, d, Fe}, K::linear, i);
      add(p + "ffn.experts.w3.weight", {E, Fe, d}, K::linear, i);
    } else {
      add(p + "ffn.w1.weight", {F, d}, K::linear, i);
      add(p + "ffn.w2.weight", {d, F}, K::linear, i);
      add(p + "ffn.w3.weight", {F, d}, K::linear, i);
    }
    add(p + "ln2.weight", {d}, K::norm, i);
  }
  add("ln_final.weight", {d}, K::norm, -1);
  add("lm_head.weight", {m.vocab, d}, K::linear, -1);
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

ParameterStore::ParameterStore(const ModelDims& dims, DType master, DType lowp, Allocator& alloc, Buffers buffers,
                               const TensorSplit& split, std::vector<StageUnits> chunks, const ExpertSplit& experts)
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
  if (has_flat_params_) params_ = Tensor::empty({total_}, master, alloc, "parameters");
  if (has_flat_grads_) grads_ = Tensor::empty({total_}, master, alloc, "gradients");
  has_lowp_ = lowp != master && has_flat_params_;
  if (has_lowp_) lowp_ = Tensor::empty({total_}, lowp, alloc, "parameters_lowp");
}

Tensor& ParameterStore::flat_params() {
  LMSCALE_CHECK(has_flat_params_, "this parameter store holds no flat parameters (FSDP keeps shards)");
  return params_;
}

Tensor ParameterStore::param(int i) const {
  LMSCALE_CHECK(has_flat_params_, "parameter {}: this store holds no flat parameters (FSDP keeps shards)",
                infos_[static_cast<std::size_t>(i)].name);
  return view(params_, i);
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
  return view(reads_master(infos_[static_cast<std::size_t>(i)]) ? params_ : lowp_, i);
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
  for (const ParamInfo& p : infos_) fill_slice_initial_values(p, seed, params_.flat_range(p.offset, p.numel), ctx);
  zero_grads(ctx);
  refresh_lowp(ctx);
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
  if (has_lowp_) ops::cast(ctx, params_, lowp_);
}

}  // namespace lmscale::model
