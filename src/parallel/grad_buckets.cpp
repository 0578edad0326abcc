#include "lmscale/parallel/grad_buckets.h"

#include "lmscale/core/error.h"

namespace lmscale::parallel {

std::vector<GradBucket> gradient_buckets(const std::vector<model::ParamInfo>& params, double max_bytes, std::size_t elem_bytes) {
  std::vector<GradBucket> out;
  const auto cap = static_cast<std::int64_t>(max_bytes / static_cast<double>(elem_bytes));
  // Reverse order, a group [s, i] of parameters that run one GEMM (ParamInfo::joins_next) at a
  // time: a bucket grows downwards, so its range is [params[s].offset, old offset + numel).
  for (int i = static_cast<int>(params.size()) - 1; i >= 0;) {
    int s = i;
    std::int64_t numel = params[static_cast<std::size_t>(i)].numel;
    while (s > 0 && params[static_cast<std::size_t>(s) - 1].joins_next) numel += params[static_cast<std::size_t>(--s)].numel;
    const std::int64_t offset = params[static_cast<std::size_t>(s)].offset;
    if (!out.empty() && out.back().numel + numel <= cap) {
      GradBucket& b = out.back();
      b.first = s;
      b.offset = offset;
      b.numel += numel;
    } else {
      out.push_back({s, i, offset, numel});
    }
    i = s - 1;
  }
  return out;
}

std::vector<GradBucket> one_bucket_per_parameter(const std::vector<model::ParamInfo>& params) {
  std::vector<GradBucket> out;
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i)
    out.push_back({i, i, params[static_cast<std::size_t>(i)].offset, params[static_cast<std::size_t>(i)].numel});
  return out;
}

std::vector<int> bucket_index(const std::vector<GradBucket>& buckets, int num_params) {
  std::vector<int> of(static_cast<std::size_t>(num_params), -1);
  for (std::size_t b = 0; b < buckets.size(); ++b)
    for (int i = buckets[b].first; i <= buckets[b].last; ++i) of[static_cast<std::size_t>(i)] = static_cast<int>(b);
  return of;
}

LazyGradients::LazyGradients(model::ParameterStore& store, double bucket_bytes, Allocator& alloc)
    : store_(store), alloc_(alloc),
      buckets_(gradient_buckets(store.infos(), bucket_bytes, dtype_size(store.master_dtype()))) {
  LMSCALE_CHECK(!store.has_flat_grads(), "LazyGradients needs a parameter store without a flat gradient buffer");
  bucket_of_ = bucket_index(buckets_, store.size());
  buffers_.resize(buckets_.size());
  store_.set_grad_provider([this](int i) { return grad(i); });
}

LazyGradients::~LazyGradients() { store_.set_grad_provider(nullptr); }

bool LazyGradients::allocated(int b) const {
  const Tensor& t = buffers_[static_cast<std::size_t>(b)];
  return t.defined() && t.data() != nullptr;
}

Tensor LazyGradients::bucket(int b) {
  if (!allocated(b))
    buffers_[static_cast<std::size_t>(b)] =
        Tensor::empty({buckets_[static_cast<std::size_t>(b)].numel}, store_.master_dtype(), alloc_, "gradients");
  return buffers_[static_cast<std::size_t>(b)];
}

Tensor LazyGradients::grad(int param) {
  const int b = bucket_of(param);
  const auto& p = store_.infos()[static_cast<std::size_t>(param)];
  return bucket(b).flat_range(p.offset - buckets_[static_cast<std::size_t>(b)].offset, p.numel).reshape(p.shape);
}

void LazyGradients::release() {
  for (auto& t : buffers_) t = Tensor();
}

void LazyGradients::release(int b) { buffers_[static_cast<std::size_t>(b)] = Tensor(); }

}  // namespace lmscale::parallel
