#include "lmscale/parallel/bucket_reducer.h"

#include "lmscale/core/error.h"

namespace lmscale::parallel {

BucketReducer::BucketReducer(std::vector<GradBucket> buckets, int num_params, BucketBackend& backend)
    : buckets_(std::move(buckets)), bucket_of_(bucket_index(buckets_, num_params)), pending_(buckets_.size(), 0),
      backend_(&backend) {
  for (int i = 0; i < num_params; ++i)
    LMSCALE_CHECK(bucket_of_[static_cast<std::size_t>(i)] >= 0, "parameter {} lies in no gradient bucket", i);
}

model::ParallelContext BucketReducer::hooks(int micro, int micro_count) {
  model::ParallelContext pc;
  if (micro + 1 != micro_count || buckets_.empty()) return pc;
  for (std::size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].last - buckets_[b].first + 1;
  armed_ = true;
  backend_->begin_step();
  pc.on_grad_ready = [this](int i) { ready(i); };
  return pc;
}

void BucketReducer::finish() {
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    LMSCALE_CHECK(pending_[b] == 0, "gradient bucket {} still waits for {} gradients after the backward", b,
                  pending_[b]);
  armed_ = false;
  backend_->complete();
}

}  // namespace lmscale::parallel
