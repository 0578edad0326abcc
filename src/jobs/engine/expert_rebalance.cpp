// Relabelling the experts of MoE blocks to even the ep ranks' loads (jobs/engine/expert_rebalance.h).
#include "lmscale/jobs/engine/expert_rebalance.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "lmscale/comm/communicator.h"
#include "lmscale/core/error.h"
#include "lmscale/core/timer.h"
#include "lmscale/ops/ops.h"
#include "lmscale/parallel/expert_placement.h"
#include "lmscale/parallel/state_layout.h"

namespace lmscale::jobs {

namespace {

constexpr int kKinds = 3;   // master, m, v (parallel::StatePiece)

const Tensor& view_of(const parallel::StatePiece& p, int k) { return k == 0 ? p.master : (k == 1 ? p.m : p.v); }

// A device (or host) view's values into host memory.
void to_host(Context& ctx, ops::Runtime& rt, const Tensor& view, float* host) {
  Tensor dst = Tensor::view(host, {view.numel()}, DType::f32, Device::cpu);
  ops::copy(ctx, view.reshape({view.numel()}), dst);
  rt.synchronize();
}

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

void ExpertRebalancer::rebalance(std::int64_t step, const std::vector<std::vector<double>>& rows) {
  if (every_ == 0) return;
  const auto& d = trainer_.dims();
  LMSCALE_CHECK(rows.size() == origin_.size(), "expert rebalance: rows of {} MoE blocks for {}", rows.size(),
                origin_.size());
  const auto layout = model::parameter_layout(d);
  const int ep = static_cast<int>(env_.cfg.parallel.ep);
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
      const std::string prefix = fmt::format("layers.{}.ffn.", l);
      for (std::size_t i = 0; i < layout.size(); ++i) {
        const auto& info = layout[i];
        if (info.name.rfind(prefix, 0) != 0) continue;   // the block's router and stacked experts
        relabel(static_cast<int>(i), info.numel / d.moe_experts, p.order);
      }
      std::vector<int>& origin = origin_[b];
      std::vector<int> next(origin.size());
      for (std::size_t i = 0; i < next.size(); ++i) next[i] = origin[static_cast<std::size_t>(p.order[i])];
      origin = next;
      ++blocks_moved;
      experts_moved += p.moved;
    }
    before_sum += p.busiest_before;
    after_sum += p.busiest_after;
    io::Row row{step, static_cast<std::int64_t>(l), static_cast<std::int64_t>(p.moved), p.busiest_before,
                p.busiest_after, timer.seconds()};
    for (int o : origin_[b]) row.push_back(static_cast<std::int64_t>(o));
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

void ExpertRebalancer::relabel(int param, std::int64_t block, const std::vector<int>& order) {
  Context& ctx = env_.rt.ctx();
  comm::Communicator& host = *env_.host_comm;
  const auto full = model::parameter_layout(trainer_.dims());
  const std::int64_t numel = full[static_cast<std::size_t>(param)].numel;
  trainer_.settle_optimizer();
  const parallel::StateLayout state = trainer_.strategy().state_layout();
  // 1. The pieces of this parameter each rank writes (together: every element once) and their
  //    values: descriptors (begin, end) and [master..., m..., v...] of the pieces in turn.
  std::vector<std::int64_t> mine;
  std::vector<float> values;
  std::int64_t count = 0;
  for (const auto& p : state.save)
    if (p.param == param) mine.push_back(p.begin), mine.push_back(p.end), count += p.end - p.begin;
  values.resize(static_cast<std::size_t>(kKinds * count));
  for (int k = 0; k < kKinds; ++k) {
    float* at = values.data() + k * count;
    for (const auto& p : state.save) {
      if (p.param != param) continue;
      const Tensor& v = view_of(p, k);
      if (v.defined()) to_host(ctx, env_.rt, v, at);
      else std::fill(at, at + (p.end - p.begin), 0.0f);   // a state the optimizer does not have
      at += p.end - p.begin;
    }
  }
  const auto ranks = static_cast<std::size_t>(host.size());
  std::vector<std::int64_t> sizes(ranks);   // per rank: descriptor entries
  const std::int64_t n_mine = static_cast<std::int64_t>(mine.size());
  host.all_gather(&n_mine, sizes.data(), 1, DType::i64).wait();
  std::vector<std::size_t> desc_counts(ranks), value_counts(ranks);
  std::size_t desc_total = 0;
  for (std::size_t r = 0; r < ranks; ++r) desc_counts[r] = static_cast<std::size_t>(sizes[r]), desc_total += desc_counts[r];
  std::vector<std::int64_t> pieces(desc_total);
  host.all_gather_v(mine.data(), pieces.data(), desc_counts, DType::i64).wait();
  std::size_t value_total = 0;
  for (std::size_t r = 0, at = 0; r < ranks; ++r) {
    std::int64_t n = 0;
    for (std::size_t i = 0; i < desc_counts[r]; i += 2) n += pieces[at + i + 1] - pieces[at + i];
    at += desc_counts[r];
    value_counts[r] = static_cast<std::size_t>(kKinds * n);
    value_total += value_counts[r];
  }
  std::vector<float> gathered(value_total);
  host.all_gather_v(values.data(), gathered.data(), value_counts, DType::f32).wait();
  // 2. The whole parameter's state [3, numel] from every rank's pieces.
  std::vector<float> whole(static_cast<std::size_t>(kKinds * numel), 0.0f);
  std::vector<bool> seen(static_cast<std::size_t>(numel), false);
  for (std::size_t r = 0, at = 0, from = 0; r < ranks; ++r) {
    const std::int64_t n = static_cast<std::int64_t>(value_counts[r]) / kKinds;
    std::int64_t in_rank = 0;
    for (std::size_t i = 0; i < desc_counts[r]; i += 2) {
      const std::int64_t begin = pieces[at + i], end = pieces[at + i + 1];
      for (int k = 0; k < kKinds; ++k)
        std::copy_n(gathered.begin() + static_cast<std::ptrdiff_t>(from + static_cast<std::size_t>(k * n + in_rank)),
                    end - begin, whole.begin() + k * numel + begin);
      std::fill(seen.begin() + begin, seen.begin() + end, true);
      in_rank += end - begin;
    }
    at += desc_counts[r];
    from += value_counts[r];
  }
  LMSCALE_CHECK(std::all_of(seen.begin(), seen.end(), [](bool s) { return s; }),
                "expert rebalance: the ranks' checkpoint pieces of '{}' do not cover it",
                full[static_cast<std::size_t>(param)].name);
  // 3. What this rank holds, in the new labels: element f of block i is old block order[i]'s.
  std::vector<float> stage;
  for (const auto& p : state.load) {
    if (p.param != param) continue;
    for (int k = 0; k < kKinds; ++k) {
      const Tensor& dst = view_of(p, k);
      if (!dst.defined()) continue;
      stage.resize(static_cast<std::size_t>(p.end - p.begin));
      for (std::int64_t f = p.begin; f < p.end;) {
        const std::int64_t i = f / block, within = f % block, run = std::min(p.end - f, block - within);
        const std::int64_t src = order[static_cast<std::size_t>(i)] * block + within;
        std::copy_n(whole.begin() + k * numel + src, run, stage.begin() + (f - p.begin));
        f += run;
      }
      Tensor src = Tensor::view(stage.data(), {p.end - p.begin}, DType::f32, Device::cpu);
      Tensor out = dst.reshape({dst.numel()});
      ops::copy(ctx, src, out);
      env_.rt.synchronize();
    }
  }
}

}  // namespace lmscale::jobs
