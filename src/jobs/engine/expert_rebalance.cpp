// Relabelling the experts of MoE blocks to even the ep ranks' loads (jobs/engine/expert_rebalance.h).
#include "lmscale/jobs/engine/expert_rebalance.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "lmscale/comm/communicator.h"
#include "lmscale/core/error.h"
#include "lmscale/core/timer.h"
#include "lmscale/model/param_layout.h"
#include "lmscale/ops/ops.h"
#include "lmscale/parallel/expert_placement.h"
#include "lmscale/parallel/state_layout.h"

namespace lmscale::jobs {

namespace {

constexpr int kKinds = 3;   // master, m, v (parallel::StatePiece)

const Tensor& view_of(const parallel::StatePiece& p, int k) { return k == 0 ? p.master : (k == 1 ? p.m : p.v); }

}  // namespace

ExpertRebalancer::ExpertRebalancer(JobEnv& env, Trainer& trainer, std::int64_t every, const std::string& table)
    : env_(env), trainer_(trainer), every_(every) {
  const auto& d = trainer.dims();
  if (every_ <= 0 || !d.moe()) {
    every_ = 0;
    return;
  }
  using C = io::Column;
  std::vector<C> columns{{"step", C::Type::i64, ""},
                         {"layer", C::Type::i64, ""},
                         {"moved", C::Type::i64, "experts"},
                         {"busiest_rank_before", C::Type::f64, ""},
                         {"busiest_rank_after", C::Type::f64, ""},
                         {"seconds", C::Type::f64, "s"}};
  for (std::int64_t e = 0; e < d.moe_experts; ++e) columns.push_back({fmt::format("origin_{}", e), C::Type::i64, ""});
  table_ = env.out.create_table(table, columns);
  std::vector<int> labels(static_cast<std::size_t>(d.moe_experts));
  std::iota(labels.begin(), labels.end(), 0);
  origin_.assign(static_cast<std::size_t>(d.moe_block_count()), labels);
}

namespace {

using PieceRange = ExpertRebalancer::PieceRange;
using RankPieces = ExpertRebalancer::RankPieces;

// Every rank's pieces, gathered over the host communicator (descriptors only: three integers a
// piece).
RankPieces gather_pieces(comm::Communicator& host, const std::vector<parallel::StatePiece>& mine) {
  const auto ranks = static_cast<std::size_t>(host.size());
  std::vector<std::int64_t> flat;
  for (const auto& p : mine) flat.push_back(p.param), flat.push_back(p.begin), flat.push_back(p.end);
  const auto n = static_cast<std::int64_t>(flat.size());
  std::vector<std::int64_t> sizes(ranks);
  host.all_gather(&n, sizes.data(), 1, DType::i64).wait();
  std::vector<std::size_t> counts(ranks);
  std::size_t total = 0;
  for (std::size_t r = 0; r < ranks; ++r) counts[r] = static_cast<std::size_t>(sizes[r]), total += counts[r];
  std::vector<std::int64_t> all(total);
  host.all_gather_v(flat.data(), all.data(), counts, DType::i64).wait();
  RankPieces out(ranks);
  for (std::size_t r = 0, at = 0; r < ranks; at += counts[r], ++r)
    for (std::size_t i = 0; i < counts[r]; i += 3)
      out[r].push_back({static_cast<int>(all[at + i]), all[at + i + 1], all[at + i + 2]});
  return out;
}

// Of every rank's pieces, those of `param`, in order.
RankPieces pieces_of(const RankPieces& all, int param) {
  RankPieces out(all.size());
  for (std::size_t r = 0; r < all.size(); ++r)
    for (const PieceRange& p : all[r])
      if (p.param == param) out[r].push_back(p);
  return out;
}

// A transfer: old elements [begin, end) of the parameter, from the sender's save piece `from` to
// the receiver's load piece `to` (indices among each rank's pieces of the parameter), where they
// start at element `at` in the new labels.
struct Transfer {
  std::int64_t begin = 0, end = 0;
  std::size_t from = 0, to = 0;
  std::int64_t at = 0;
};

}  // namespace

void ExpertRebalancer::rebalance(std::int64_t step, const std::vector<std::vector<double>>& rows) {
  if (every_ == 0) return;
  const auto& d = trainer_.dims();
  LMSCALE_CHECK(rows.size() == origin_.size(), "expert rebalance: rows of {} MoE blocks for {}", rows.size(),
                origin_.size());
  const auto layout = model::parameter_layout(d);
  const model::ParamIndex index(d);
  const int ep = static_cast<int>(env_.cfg.parallel.ep);
  trainer_.settle_optimizer();
  const parallel::StateLayout state = trainer_.strategy().state_layout();
  const RankPieces saves = gather_pieces(*env_.host_comm, state.save), loads = gather_pieces(*env_.host_comm, state.load);
  std::size_t b = 0;
  int blocks_moved = 0, experts_moved = 0;
  double before_sum = 0, after_sum = 0;
  WallTimer all;
  for (int l = 0; l < d.layers; ++l) {
    if (!d.is_moe_block(l)) continue;
    WallTimer timer;
    // Every rank computes the same placement from the same (world-summed) rows.
    const parallel::ExpertPlacement p = parallel::balanced_placement(rows[b], ep);
    if (!p.identity()) {
      // The block's router [E, d] and stacked experts [E, ...]: E blocks of rows each.
      const model::BlockParams bp = index.block(l);
      for (int i : {bp.router, bp.w1, bp.w3, bp.w2})
        relabel(state, saves, loads, i, layout[static_cast<std::size_t>(i)].numel / d.moe_experts, p.order);
      std::vector<int>& origin = origin_[b];
      std::vector<int> next(origin.size());
      for (std::size_t i = 0; i < next.size(); ++i) next[i] = origin[static_cast<std::size_t>(p.order[i])];
      origin = next;
      ++blocks_moved;
      experts_moved += p.moved;
    }
    before_sum += p.busiest_before;
    after_sum += p.busiest_after;
    io::Row row(6 + origin_[b].size());   // the columns in order (the constructor's)
    row[0] = step, row[1] = static_cast<std::int64_t>(l), row[2] = static_cast<std::int64_t>(p.moved);
    row[3] = p.busiest_before, row[4] = p.busiest_after, row[5] = timer.seconds();
    for (std::size_t e = 0; e < origin_[b].size(); ++e) row[6 + e] = static_cast<std::int64_t>(origin_[b][e]);
    table_->append(row);
    ++b;
  }
  table_->flush();
  // The working copies (bf16 weights) follow the master weights, as after a checkpoint's restore.
  model::ParameterStore& store = trainer_.params();
  if (blocks_moved > 0 && store.has_flat_params() && store.has_lowp()) store.refresh_lowp(env_.rt.ctx());
  if (env_.is_root()) {
    const double n = static_cast<double>(std::max<std::size_t>(1, origin_.size()));
    fmt::print("ep rebalance after step {}: busiest ep rank {:.3f}x -> {:.3f}x the mean rank's rows (mean over {} MoE "
               "blocks); {} experts of {} blocks moved in {:.2f} s\n",
               step, before_sum / n, after_sum / n, origin_.size(), experts_moved, blocks_moved, all.seconds());
    std::fflush(stdout);
  }
}


void ExpertRebalancer::relabel(const parallel::StateLayout& state, const RankPieces& saves_all,
                               const RankPieces& loads_all, int param, std::int64_t block,
                               const std::vector<int>& order) {
  // Only what moves crosses: the elements of every relabelled block (order[i] != i) that some rank
  // holds, from the rank that writes them to checkpoints (the save pieces cover each element once),
  // in one all-to-all over the device communicator; everything else stays where it is.
  Context& ctx = env_.rt.ctx();
  comm::Communicator& host = *env_.host_comm;
  comm::Communicator& device = *env_.comm;
  std::vector<std::size_t> saves, loads;   // this rank's pieces of `param` (indices into state)
  for (std::size_t i = 0; i < state.save.size(); ++i)
    if (state.save[i].param == param) saves.push_back(i);
  for (std::size_t i = 0; i < state.load.size(); ++i)
    if (state.load[i].param == param) loads.push_back(i);
  const RankPieces all_have = pieces_of(saves_all, param), all_held = pieces_of(loads_all, param);
  const auto ranks = static_cast<std::size_t>(host.size()), me = static_cast<std::size_t>(host.rank());
  // [sender][receiver]: the transfers, in one order every rank derives alike: receivers' held
  // pieces in order, each cut at block boundaries, each moved cut's old range (block order[i])
  // cut again by the senders' save pieces.
  std::vector<std::int64_t> moved_held(ranks, 0);   // per rank: elements of relabelled blocks it holds
  std::vector<std::vector<std::vector<Transfer>>> plan(ranks, std::vector<std::vector<Transfer>>(ranks));
  for (std::size_t q = 0; q < ranks; ++q)
    for (std::size_t h = 0; h < all_held[q].size(); ++h)
      for (std::int64_t f = all_held[q][h].begin; f < all_held[q][h].end;) {
        const std::int64_t i = f / block, end = std::min(all_held[q][h].end, (i + 1) * block);
        const std::int64_t shift = (order[static_cast<std::size_t>(i)] - i) * block;   // new -> old
        if (shift != 0) {
          moved_held[q] += end - f;
          for (std::size_t p = 0; p < ranks; ++p)
            for (std::size_t s = 0; s < all_have[p].size(); ++s) {
              const std::int64_t a = std::max(f + shift, all_have[p][s].begin), b = std::min(end + shift, all_have[p][s].end);
              if (a < b) plan[p][q].push_back({a, b, s, h, a - shift});
            }
        }
        f = end;
      }
  auto count = [](const std::vector<Transfer>& ts) {
    std::int64_t n = 0;
    for (const Transfer& t : ts) n += t.end - t.begin;
    return n;
  };
  // Every moved element a rank holds must come from exactly one writer (the save pieces cover each
  // element once), else a stale value would stay in place silently. Every rank checks every rank
  // (the plan is the same everywhere), so all of them stop together instead of one hanging.
  for (std::size_t q = 0; q < ranks; ++q) {
    std::int64_t arriving = 0;
    for (std::size_t p = 0; p < ranks; ++p) arriving += count(plan[p][q]);
    LMSCALE_CHECK(arriving == moved_held[q], "expert rebalance: rank {} holds {} moved elements of parameter {}, {} "
                  "arrive (the ranks' checkpoint pieces do not cover it once)", q, moved_held[q], param, arriving);
  }
  std::vector<std::size_t> send_counts(ranks), recv_counts(ranks);
  std::int64_t send_total = 0, recv_total = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    send_counts[r] = static_cast<std::size_t>(kKinds * count(plan[me][r]));
    recv_counts[r] = static_cast<std::size_t>(kKinds * count(plan[r][me]));
    send_total += static_cast<std::int64_t>(send_counts[r]);
    recv_total += static_cast<std::int64_t>(recv_counts[r]);
  }
  if (send_total == 0 && recv_total == 0) return;   // nothing of this parameter moves here
  Tensor send = Tensor::empty({send_total}, DType::f32, *ctx.allocator, "ep_rebalance");
  Tensor recv = Tensor::empty({recv_total}, DType::f32, *ctx.allocator, "ep_rebalance");
  // Per peer: [master..., m..., v...] of its transfers in order.
  std::int64_t at = 0;
  for (std::size_t q = 0; q < ranks; ++q)
    for (int k = 0; k < kKinds; ++k)
      for (const Transfer& t : plan[me][q]) {
        const parallel::StatePiece& piece = state.save[saves[t.from]];
        Tensor dst = send.flat_range(at, t.end - t.begin);
        const Tensor& src = view_of(piece, k);
        if (src.defined()) ops::copy(ctx, src.flat_range(t.begin - piece.begin, t.end - t.begin), dst);
        else ops::fill(ctx, dst, 0.0);   // a state the optimizer does not have
        at += t.end - t.begin;
      }
  device.all_to_all_v(send, send_counts, recv, recv_counts).wait();
  at = 0;
  for (std::size_t p = 0; p < ranks; ++p)
    for (int k = 0; k < kKinds; ++k)
      for (const Transfer& t : plan[p][me]) {
        const parallel::StatePiece& piece = state.load[loads[t.to]];
        const Tensor& dst = view_of(piece, k);
        if (dst.defined()) {
          Tensor out = dst.flat_range(t.at - piece.begin, t.end - t.begin);
          ops::copy(ctx, recv.flat_range(at, t.end - t.begin), out);
        }
        at += t.end - t.begin;
      }
  env_.rt.synchronize();
}

}  // namespace lmscale::jobs
