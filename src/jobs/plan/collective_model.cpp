#include "lmscale/jobs/plan/collective_model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "lmscale/core/error.h"

namespace lmscale::jobs::plan {

namespace {

// Ring steps and the share of the buffer each rank moves (nccl-tests' bus-bandwidth factor).
std::pair<double, double> ring_shape(CollectiveOp op, int n) {
  const double m = n - 1.0;
  switch (op) {
    case CollectiveOp::all_reduce: return {2 * m, 2 * m / n};
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_gather: return {m, m / n};
    case CollectiveOp::broadcast: return {m, 1.0};   // pipelined chain: n-1 steps, the buffer once
    case CollectiveOp::all_to_all: return {m, m / n};  // pairwise: n-1 steps, each rank sends (n-1)/n of its buffer
  }
  return {0, 0};
}

}  // namespace

double ring_time(CollectiveOp op, int n, double bytes, const Link& link) {
  if (n <= 1) return 0;
  const auto [steps, share] = ring_shape(op, n);
  return steps * link.alpha_s + share * bytes / link.bus_bytes_per_s;
}

double tree_all_reduce_time(int n, double bytes, const Link& link) {
  if (n <= 1) return 0;
  return 2 * std::ceil(std::log2(static_cast<double>(n))) * link.alpha_s + 2 * bytes / link.bus_bytes_per_s;
}

CollectiveTime collective_time(CollectiveOp op, double bytes, const Placement& where, const Cluster& c) {
  if (where.ranks <= 1 || bytes <= 0) return {0, "none", false};
  const bool inter = where.nodes() > 1;
  const Link& link = inter ? c.inter : c.intra;
  CollectiveTime t{ring_time(op, where.ranks, bytes, link), "ring", inter};
  if (op == CollectiveOp::all_reduce) {
    const double tree = tree_all_reduce_time(where.ranks, bytes, link);
    if (tree < t.seconds) t = {tree, "tree", inter};
  }
  return t;
}

CollectiveTime p2p_time(double bytes, bool inter_node, const Cluster& c) {
  const Link& link = inter_node ? c.inter : c.intra;
  return {link.alpha_s + bytes / link.bus_bytes_per_s, "p2p", inter_node};
}

Link fit_ring_link(CollectiveOp op, int n, const std::vector<std::pair<double, double>>& bytes_seconds) {
  if (n < 2) throw UsageError("fit_ring_link: a collective fit needs at least 2 ranks");
  if (bytes_seconds.size() < 2) throw UsageError("fit_ring_link: a collective fit needs at least 2 message sizes");
  const auto [steps, share] = ring_shape(op, n);
  // t = steps a + share S b, a = alpha, b = 1 / beta; weights 1/t make the error relative.
  double uu = 0, uv = 0, vv = 0, u1 = 0, v1 = 0;
  for (const auto& [S, t] : bytes_seconds) {
    if (S <= 0 || t <= 0) throw Error(fmt::format("fit_ring_link: bad point ({} B, {} s)", S, t));
    const double u = steps / t, v = share * S / t;
    uu += u * u, uv += u * v, vv += v * v, u1 += u, v1 += v;
  }
  const double det = uu * vv - uv * uv;
  double a = det != 0 ? (u1 * vv - v1 * uv) / det : 0, b = det != 0 ? (uu * v1 - uv * u1) / det : 0;
  if (a < 0 || det == 0) a = 0, b = v1 / vv;   // no latency term left: the bandwidth alone
  if (b <= 0) {
    // The times do not grow with the size (noise larger than the bandwidth term over the sizes
    // measured): the largest message alone sets the bandwidth, with no latency term.
    const auto& [S, t] = *std::max_element(bytes_seconds.begin(), bytes_seconds.end());
    a = 0;
    b = t / (share * S);
  }
  return {a, 1.0 / b};
}

}  // namespace lmscale::jobs::plan
