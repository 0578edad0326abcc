#pragma once
// Gradients kept per bucket instead of in one flat buffer (docs/architecture.md §4: a strategy's
// concern, so it lives in parallel/; the model only sees the store's gradient provider). A bucket is a contiguous range of
// parameters taken in reverse order (the order the backward finishes them), at most max_bytes
// unless one parameter (or one group) is larger. A group of parameters that run one GEMM side by
// side (ParamInfo::joins_next: q|k|v, w1|w3) is never split between buckets, so their gradients
// lie back to back in every layout and their weight gradient is one product everywhere. With a LazyGradients installed as the parameter store's
// gradient provider, a bucket's buffer is allocated when the backward first writes one of its
// gradients -- by then the activations of the layers after it are freed -- and released when the
// step no longer needs it, so gradients and the full set of activations never coexist.
#include <cstdint>
#include <vector>

#include "lmscale/core/allocator.h"
#include "lmscale/core/tensor.h"
#include "lmscale/model/parameter_store.h"

namespace lmscale::parallel {


struct GradBucket {
  int first = 0, last = 0;               // parameter indices [first, last]
  std::int64_t offset = 0, numel = 0;    // elements [offset, offset+numel) of the flat layout
};
std::vector<GradBucket> gradient_buckets(const std::vector<model::ParamInfo>& params, double max_bytes, std::size_t elem_bytes);
// One bucket per parameter, in reverse order (DDP overlap: each gradient reduced as it is ready).
std::vector<GradBucket> one_bucket_per_parameter(const std::vector<model::ParamInfo>& params);
// For each of `num_params` parameters, the index of the bucket that holds it.
std::vector<int> bucket_index(const std::vector<GradBucket>& buckets, int num_params);

class LazyGradients {
 public:
  // Installs itself as store's gradient provider (store must have no flat gradient buffer).
  LazyGradients(model::ParameterStore& store, double bucket_bytes, Allocator& alloc);
  ~LazyGradients();   // uninstalls the provider
  LazyGradients(const LazyGradients&) = delete;
  LazyGradients& operator=(const LazyGradients&) = delete;

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  int bucket_of(int param) const { return bucket_of_[static_cast<std::size_t>(param)]; }
  bool allocated(int b) const;
  // Bucket b's gradients [numel] (allocated on demand).
  Tensor bucket(int b);
  // Frees every bucket buffer (the next backward allocates them again).
  void release();
  // Frees bucket b's buffer only (the frees are ordered on the allocator's stream: the caller
  // makes sure no other stream still reads it).
  void release(int b);

 private:
  Tensor grad(int param);
  model::ParameterStore& store_;
  Allocator& alloc_;
  std::vector<GradBucket> buckets_;
  std::vector<int> bucket_of_;
  std::vector<Tensor> buffers_;
};

}  // namespace lmscale::parallel
