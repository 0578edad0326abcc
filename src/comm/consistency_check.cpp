#include "consistency_check.h"

#include <map>

#include <fmt/ranges.h>

namespace lmscale::comm::detail {

namespace {

std::int64_t counts_hash(const Request& req) {
  std::uint64_t h = 1469598103934665603ull;   // FNV-1a over the per-rank counts
  for (auto c : req.counts) {
    h ^= static_cast<std::uint64_t>(c);
    h *= 1099511628211ull;
  }
  return static_cast<std::int64_t>(h >> 1);
}

std::string text(const Descriptor& d) {
  const auto kind = static_cast<OpKind>(d[0]);
  std::string s = fmt::format("{} {} count={}", op_kind_name(kind), dtype_name(static_cast<DType>(d[1])), d[3]);
  if (kind == OpKind::all_reduce || kind == OpKind::reduce_scatter)
    s += fmt::format(" op={}", reduce_op_name(static_cast<ReduceOp>(d[2])));
  if (d[4] != 0) s += fmt::format(" uneven-counts#{:x}", d[4] & 0xffffff);
  if (kind == OpKind::broadcast) s += fmt::format(" root={}", d[5]);
  s += fmt::format(" algo={}", algo_name(static_cast<Algo>(d[6])));
  return s;
}

}  // namespace

Descriptor describe_call(const Request& req, Algo resolved_algo, int size) {
  Descriptor d{};
  d[0] = static_cast<std::int64_t>(req.kind);
  d[1] = static_cast<std::int64_t>(req.dtype);
  d[2] = (req.kind == OpKind::all_reduce || req.kind == OpKind::reduce_scatter) ? static_cast<std::int64_t>(req.op) : 0;
  // An all-to-all's blocks differ per rank by design: its even count is compared, its v-form's
  // counts pairwise (all_to_all_count_errors).
  const bool per_rank = req.kind == OpKind::barrier || (req.kind == OpKind::all_to_all && req.uneven());
  d[3] = per_rank ? 0 : static_cast<std::int64_t>(req.uneven() ? req.total_count(size) : req.count);
  d[4] = req.uneven() && req.kind != OpKind::all_to_all ? counts_hash(req) : 0;
  d[5] = req.kind == OpKind::broadcast ? req.peer : 0;
  d[6] = static_cast<std::int64_t>(resolved_algo);
  d[7] = 0x6c6d73;   // marks a check-mode descriptor
  return d;
}

std::string all_to_all_count_errors(const Request& req, const std::vector<std::int64_t>& sent_to_me, int rank) {
  std::string out;
  for (std::size_t r = 0; r < sent_to_me.size(); ++r) {
    const auto expected = static_cast<std::int64_t>(req.recv_block_count(static_cast<int>(r)));
    if (sent_to_me[r] != expected)
      out += fmt::format(" [rank {} sends {} elements to rank {}, which expects {}]", r, sent_to_me[r], rank, expected);
  }
  return out;
}

void verify_descriptors(const std::vector<Descriptor>& all) {
  bool same = true;
  for (const auto& d : all) same = same && d == all.front();
  if (same) return;
  std::map<Descriptor, std::vector<int>> groups;
  for (std::size_t r = 0; r < all.size(); ++r) groups[all[r]].push_back(static_cast<int>(r));
  std::string msg = "collective mismatch between ranks (check mode):";
  for (const auto& [d, ranks] : groups) {
    const std::string who = ranks.size() > 8 ? fmt::format("{} ranks incl. {}", ranks.size(), ranks.front())
                                             : fmt::format("rank{} {}", ranks.size() > 1 ? "s" : "",
                                                           fmt::join(ranks, ","));
    msg += fmt::format(" [{}: {}]", who, text(d));
  }
  throw MismatchError(msg);
}

}  // namespace lmscale::comm::detail
