#include "lmscale/parallel/spec.h"

#include <algorithm>

namespace lmscale::parallel {

Spec Spec::resolve(const ParallelConfig& pc, int world) {
  Spec s;
  s.tp = static_cast<int>(std::max<std::int64_t>(1, pc.tp));
  s.pp = static_cast<int>(std::max<std::int64_t>(1, pc.pp));
  s.dp = pc.dp > 0 ? static_cast<int>(pc.dp) : std::max(1, world / (s.tp * s.pp));
  s.zero = pc.zero;
  s.ddp = pc.ddp;
  s.bucket_mb = pc.bucket_mb;
  return s;
}

comm::MeshShape Spec::mesh_shape() const {
  comm::MeshShape m;
  m.dp = dp;
  m.tp = tp;
  m.pp = pp;
  m.shard = dp;
  return m;
}

GradStorage Spec::grad_storage() const {
  if (fsdp()) return GradStorage::shards;
  if (dp == 1 || zero == ZeroLevel::zero2) return GradStorage::lazy_buckets;
  return GradStorage::flat;
}

double Spec::lazy_bucket_bytes() const { return dp == 1 ? kOneProcessBucketBytes : bucket_mb * 1024.0 * 1024.0; }

}  // namespace lmscale::parallel
