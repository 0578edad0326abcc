// The replay's gradient provider (memory_replay.h, Grads): a parameter's bucket allocated the
// first time the backward asks for one of its gradients, and the reduce's staging buffers.
#include <cstdint>

#include "lmscale/parallel/grad_buckets.h"
#include "memory_replay.h"

namespace lmscale::jobs::replay {

void Grads::init(const std::vector<double>& sizes, const std::vector<bool>& joins, double max_bytes) {
  // The store's buckets (parallel::gradient_buckets) over parameters of these sizes and groups.
  std::vector<model::ParamInfo> params(sizes.size());
  std::int64_t at = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    params[i].offset = at;
    params[i].numel = static_cast<std::int64_t>(sizes[i]);
    params[i].joins_next = joins[i];
    at += params[i].numel;
  }
  const auto buckets = parallel::gradient_buckets(params, max_bytes, 4);
  bucket_of = std::vector<int>(sizes.size(), -1);
  bucket_bytes.clear();
  for (const auto& b : buckets) {
    for (int i = b.first; i <= b.last; ++i) bucket_of[static_cast<std::size_t>(i)] = static_cast<int>(bucket_bytes.size());
    bucket_bytes.push_back(4.0 * static_cast<double>(b.numel));
  }
  held.assign(bucket_bytes.size(), false);
}

void Grads::ready(int i) {
  const int j = local.empty() ? i : local[static_cast<std::size_t>(i)];
  if (j < 0 || group_of.empty() || !staging_armed || counted[static_cast<std::size_t>(j)]) return;
  counted[static_cast<std::size_t>(j)] = true;
  const auto g = static_cast<std::size_t>(group_of[static_cast<std::size_t>(j)]);
  if (--group_pending[g] == 0) sim->alloc(group_stage[g]);
}

void Grads::touch(int i, bool ready_now) {
  if (fsdp) {
    const int u = unit_of_param[static_cast<std::size_t>(i)];
    if (u >= 0 && full[static_cast<std::size_t>(u)] <= 0)
      full[static_cast<std::size_t>(u)] = sim->alloc(4 * unit_padded[static_cast<std::size_t>(u)]);
    return;
  }
  const int j = local.empty() ? i : local[static_cast<std::size_t>(i)];
  if (j < 0) return;   // not on this stage (cannot happen: a stage's backward touches its own)
  if (ready_now) ready(i);
  if (!lazy) return;
  const auto b = static_cast<std::size_t>(bucket_of[static_cast<std::size_t>(j)]);
  if (held[b]) return;
  held[b] = true;
  sim->alloc(bucket_bytes[b]);
}

void Grads::hold_all() {
  if (!lazy) return;
  for (std::size_t b = 0; b < held.size(); ++b) {
    held[b] = true;
    sim->alloc(bucket_bytes[b]);
  }
}

double Grads::total() const {
  double t = 0;
  for (double b : bucket_bytes) t += b;
  return t;
}

double Grads::staging_total() const {
  double t = finish_stage;
  for (double b : group_stage) t += b;
  return t;
}

}  // namespace lmscale::jobs::replay
