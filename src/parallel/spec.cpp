#include "lmscale/parallel/spec.h"

#include <algorithm>

#include <fmt/format.h>

namespace lmscale::parallel {

Spec Spec::resolve(const ParallelConfig& pc, int world) {
  Spec s;
  s.tp = static_cast<int>(std::max<std::int64_t>(1, pc.tp));
  s.pp = static_cast<int>(std::max<std::int64_t>(1, pc.pp));
  s.dp = pc.dp > 0 ? static_cast<int>(pc.dp) : std::max(1, world / (s.tp * s.pp));
  s.zero = pc.zero;
  s.ddp = pc.ddp;
  s.bucket_mb = pc.bucket_mb;
  s.grad_exchange = pc.grad_exchange;
  s.grad_reduce_dtype = pc.grad_reduce_dtype;
  s.sequence_parallel = pc.sequence_parallel;
  s.offload = pc.offload;
  s.schedule = pc.schedule;
  s.ep = static_cast<int>(std::max<std::int64_t>(1, pc.ep));
  s.ep_exchange = pc.ep_exchange;
  return s;
}

comm::MeshShape Spec::mesh_shape() const {
  comm::MeshShape m;
  m.dp = dp;
  m.tp = tp;
  m.pp = pp;
  m.shard = dp;
  m.ep = ep;
  return m;
}

GradStorage Spec::grad_storage() const {
  if (fsdp()) return GradStorage::shards;
  if (gradient_group() == 1 || zero == ZeroLevel::zero2) return GradStorage::lazy_buckets;
  return GradStorage::flat;
}

bool Spec::gradient_shard() const {
  return sharded_optimizer() && zero != ZeroLevel::zero1_broadcast && zero != ZeroLevel::fsdp;
}

ReduceStaging Spec::reduce_staging() const {
  if (gradient_group() <= 1 || grad_reduce_dtype != GradReduceDtype::bf16) return ReduceStaging::none;
  if (zero == ZeroLevel::zero2) return ReduceStaging::buckets;
  if (zero != ZeroLevel::none) return ReduceStaging::none;
  if (ddp == DdpKind::overlap) return ReduceStaging::per_param;
  if (ddp == DdpKind::bucketed) return ReduceStaging::buckets;
  return ReduceStaging::flat;   // ddp none (run as flat) or flat
}

CopyEngineWindow Spec::copy_engine_window() const {
  if (gradient_group() <= 1 || grad_exchange != GradExchange::copy_engine) return CopyEngineWindow::none;
  if (zero == ZeroLevel::zero2) return CopyEngineWindow::shard_slots;
  if (zero == ZeroLevel::none && ddp == DdpKind::bucketed) return CopyEngineWindow::bucket_parts;
  return CopyEngineWindow::none;
}

GradientTiming Spec::gradient_timing() const {
  if (dp <= 1) return GradientTiming::none;
  if (fsdp()) return GradientTiming::per_unit;
  if (zero == ZeroLevel::zero2) return GradientTiming::during_backward;
  if (zero == ZeroLevel::none && (ddp == DdpKind::overlap || ddp == DdpKind::bucketed))
    return GradientTiming::during_backward;
  return GradientTiming::after_backward;   // ddp none (flat), naive, flat; zero1, zero1-broadcast
}

CollectiveOp Spec::gradient_collective() const {
  return fsdp() || gradient_shard() ? CollectiveOp::reduce_scatter : CollectiveOp::all_reduce;
}

double pipeline_idle(PipelineSchedule schedule, int stages, int microbatches, int virtual_stages, double f, double b,
                     double w) {
  if (stages <= 1) return 0;
  const double hops = stages - 1;
  switch (schedule) {
    case PipelineSchedule::zb_h1: return hops * (f + b) - (std::min(microbatches, stages) - 1) * w;
    case PipelineSchedule::interleaved: return hops * (f + b + w) / std::max(1, virtual_stages);
    case PipelineSchedule::gpipe:
    case PipelineSchedule::one_f_one_b: break;
  }
  return hops * (f + b + w);
}

double Spec::bubble_idle(int microbatches, int virtual_stages, double f, double b, double w) const {
  return pipeline_idle(schedule, pp, microbatches, virtual_stages, f, b, w);
}

std::string Spec::data_parallel_name() const {
  if (zero != ZeroLevel::none) return to_string(zero);
  return "ddp " + (ddp == DdpKind::none ? std::string("flat") : to_string(ddp));
}

std::string Spec::describe(int world) const {
  if (world == 1) return "one process";
  std::string mode = data_parallel_name();
  if (tp > 1) mode += fmt::format(" x tp {}{}", tp, sequence_parallel ? " (sequence parallel)" : "");
  if (pp > 1) mode += fmt::format(" x pp {} ({})", pp, schedule);
  if (ep > 1) mode += fmt::format(" x ep {}", ep);
  return fmt::format("{} ({} ranks)", mode, world);
}

double Spec::lazy_bucket_bytes() const {
  return gradient_group() == 1 ? kOneProcessBucketBytes : bucket_mb * 1024.0 * 1024.0;
}

Spec Spec::gradient_group_spec() const {
  Spec s = *this;
  s.dp = gradient_group();
  s.ep = 1;
  return s;
}

}  // namespace lmscale::parallel
