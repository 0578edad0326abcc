// The accounting's formula rows under expert parallelism (jobs/predict/accounting.h,
// docs/parallel.md "Expert parallelism"): a rank's store holds the dense parameters and its E/ep
// of every MoE block's experts, and ZeRO/FSDP shard that store over the expert_dp group of dp/ep
// ranks. The expected values are counted from the store's own layout (model::parameter_layout cut
// to ep rank 0's experts by model::expert_parallel_layout; is_expert_parameter, ParamInfo::Kind),
// not from ModelDims, which the accounting uses.
#include <gtest/gtest.h>

#include <cmath>

#include "lmscale/jobs/predict/accounting.h"
#include "lmscale/jobs/predict/memory_model.h"
#include "lmscale/model/expert_parallel.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/model/parameter_store.h"

using namespace lmscale;

namespace {

// A small MoE model whose experts dominate its parameters: d 64, 2 blocks (both MoE) of 8
// experts of d_ff 256, top-2, vocabulary 96, 16 tokens; CPU, fp32, AdamW.
Config small_moe(std::int64_t dp, std::int64_t ep, ZeroLevel zero) {
  Config c;
  c.run.job = JobKind::accounting;
  c.model.vocab_size = 96;
  c.model.d_model = 64;
  c.model.d_ff = 128;
  c.model.num_layers = 2;
  c.model.num_heads = 4;
  c.model.context_length = 16;
  c.model.moe_experts = 8;
  c.model.moe_top_k = 2;
  c.model.moe_expert_dff = 256;
  c.parallel.dp = dp;
  c.parallel.ep = ep;
  c.parallel.zero = zero;
  c.parallel.device = DeviceChoice::cpu;
  c.train.batch_size = dp;   // one sequence per rank
  return c;
}

struct StoreCounts {
  double held = 0, norms = 0, experts = 0;   // elements in ep rank 0's store
};

StoreCounts store_counts(const Config& c) {
  const auto dims = model::ModelDims::from(c.model);
  model::ExpertSplit split;
  split.degree = static_cast<int>(c.parallel.ep);
  split.rank = 0;
  StoreCounts s;
  for (const auto& p : model::expert_parallel_layout(model::parameter_layout(dims), dims, split)) {
    s.held += static_cast<double>(p.numel);
    if (p.kind == model::ParamInfo::Kind::norm) s.norms += static_cast<double>(p.numel);
    if (model::is_expert_parameter(p)) s.experts += static_cast<double>(p.numel);
  }
  return s;
}

double item(const jobs::Accounting& a, const std::string& n) {
  for (const auto& i : a.memory)
    if (i.name == n) return i.bytes;
  ADD_FAILURE() << "no row " << n;
  return -1;
}

}  // namespace

// The store of ep rank 0 holds E/ep of the experts: the check of the counting below.
TEST(AccountingEp, StoreHoldsItsShareOfTheExperts) {
  const StoreCounts one = store_counts(small_moe(2, 1, ZeroLevel::none)), two = store_counts(small_moe(2, 2, ZeroLevel::none));
  EXPECT_DOUBLE_EQ(two.experts, one.experts / 2);
  EXPECT_DOUBLE_EQ(two.held - two.experts, one.held - one.experts);
  EXPECT_GT(one.experts, 10 * (one.held - one.experts));   // the experts dominate
}

// ep = dp = 2: nothing left to shard (one process per ep rank): the whole store, per-bucket
// gradients (0 at the start of the backward), AdamW m and v of the whole store; zero2 alike.
TEST(AccountingEp, Ep2HoldsItsExpertsOnly) {
  for (ZeroLevel zero : {ZeroLevel::none, ZeroLevel::zero2}) {
    const Config c = small_moe(2, 2, zero);
    const StoreCounts s = store_counts(c);
    const auto a = jobs::account(c, 2, "");
    EXPECT_DOUBLE_EQ(item(a, "parameters"), 4 * s.held);
    EXPECT_DOUBLE_EQ(item(a, "gradients"), 0.0);
    EXPECT_DOUBLE_EQ(item(a, "optimizer_state"), 8 * s.held);
    for (const auto& it : a.memory) EXPECT_NE(it.name, "gradient_shard");
  }
}

// dp 4 = expert_dp 2 x ep 2: DDP keeps one flat gradient buffer of the store; zero1 and zero2
// shard the optimizer state (and their gradient shard) over expert_dp = 2.
TEST(AccountingEp, DataParallelOverExpertDp) {
  {
    const Config c = small_moe(4, 2, ZeroLevel::none);
    const StoreCounts s = store_counts(c);
    const auto a = jobs::account(c, 4, "");
    EXPECT_DOUBLE_EQ(item(a, "parameters"), 4 * s.held);
    EXPECT_DOUBLE_EQ(item(a, "gradients"), 4 * s.held);
    EXPECT_DOUBLE_EQ(item(a, "optimizer_state"), 8 * s.held);
  }
  for (ZeroLevel zero : {ZeroLevel::zero1, ZeroLevel::zero2}) {
    const Config c = small_moe(4, 2, zero);
    const StoreCounts s = store_counts(c);
    const auto a = jobs::account(c, 4, "");
    EXPECT_DOUBLE_EQ(item(a, "parameters"), 4 * s.held);
    EXPECT_DOUBLE_EQ(item(a, "gradients"), zero == ZeroLevel::zero2 ? 0.0 : 4 * s.held);
    EXPECT_DOUBLE_EQ(item(a, "gradient_shard"), 4 * s.held / 2);
    EXPECT_DOUBLE_EQ(item(a, "optimizer_state"), 8 * s.held / 2);
    bool shown = false;   // the formula shows the split
    for (const auto& it : a.memory)
      if (it.name == "optimizer_state") shown = it.formula.find("(P - Pe + Pe/ep) / (dp/ep)") != std::string::npos;
    EXPECT_TRUE(shown);
  }
}

// fsdp over expert_dp = 2: the master, gradient shard and optimizer state of the store's non-norm
// elements in halves, the norms replicated; the gathered buffers count the MoE unit of this
// rank's experts (attention 4d^2, router E d, 3 d Fe E/ep), prefetched, and the head unit.
TEST(AccountingEp, FsdpShardsTheStoreOverExpertDp) {
  const Config c = small_moe(4, 2, ZeroLevel::fsdp);
  const StoreCounts s = store_counts(c);
  const auto a = jobs::account(c, 4, "");
  const double shard = (s.held - s.norms) / 2;
  EXPECT_DOUBLE_EQ(item(a, "parameters"), 4 * shard + 4 * s.norms);
  EXPECT_DOUBLE_EQ(item(a, "gradient_shard"), 4 * shard);
  EXPECT_DOUBLE_EQ(item(a, "gradients"), 4 * s.norms);
  EXPECT_DOUBLE_EQ(item(a, "optimizer_state"), 8 * (shard + s.norms));
  const double d = 64, E = 8, Fe = 256, V = 96;
  const double unit = 4 * d * d + E * d + 3 * d * Fe * E / 2;
  EXPECT_DOUBLE_EQ(item(a, "fsdp_gathered"), 4 * (V * d + static_cast<double>(c.parallel.fsdp_prefetch) * unit));
}

// Communication per step: the strategy's over expert_dp on the store, plus the all-reduce of the
// dense gradients over ep, 2 (ep-1)/ep x 4 B x (P - Pe) (fsdp: once per micro-batch).
TEST(AccountingEp, CommunicationOverExpertDpAndEp) {
  Config c = small_moe(4, 2, ZeroLevel::zero1);
  const StoreCounts s = store_counts(c);
  const double dense = s.held - s.experts, ep_sum = 2 * 0.5 * 4 * dense;
  // zero1 in fp32: reduce-scatter and all-gather of the store's 4 B over its 2 expert_dp ranks.
  EXPECT_DOUBLE_EQ(jobs::account(c, 4, "").comm_bytes_per_step, 0.5 * 4 * s.held + 0.5 * 4 * s.held + ep_sum);
  c.parallel.dp = 2;   // ep = dp: no expert_dp traffic, the dense sum only
  c.train.batch_size = 2;
  EXPECT_DOUBLE_EQ(jobs::account(c, 2, "").comm_bytes_per_step, ep_sum);
  c = small_moe(4, 2, ZeroLevel::fsdp);
  c.train.grad_accum = 2;
  c.train.batch_size = 8;
  const double Ps = s.held - s.norms, norms = s.norms;
  // fp32 gathers twice (reshard_after_forward), one reduce-scatter, the norms' all-reduce.
  EXPECT_DOUBLE_EQ(jobs::account(c, 4, "").comm_bytes_per_step,
                   0.5 * (2 * 4 * Ps + 4 * Ps) + 2 * 0.5 * 4 * norms + 2 * ep_sum);
}

// ep = 1 leaves the dense count: every expert on every rank.
TEST(AccountingEp, Ep1CountsEveryExpert) {
  const Config c = small_moe(2, 1, ZeroLevel::zero1);
  const StoreCounts s = store_counts(c);
  const auto a = jobs::account(c, 2, "");
  EXPECT_DOUBLE_EQ(item(a, "parameters"), 4 * s.held);
  EXPECT_DOUBLE_EQ(item(a, "optimizer_state"), 8 * s.held / 2);
}

struct Layout {
  std::int64_t dp, ep;
  ZeroLevel zero;
};
const Layout kLayouts[] = {{2, 2, ZeroLevel::none}, {2, 2, ZeroLevel::zero2}, {4, 2, ZeroLevel::none},
                           {4, 2, ZeroLevel::zero1}, {4, 2, ZeroLevel::zero2}, {4, 2, ZeroLevel::fsdp}};

// The state rows (parameters, gradients, gradient_shard, optimizer_state) are what the replay
// (memory_model.h, exact on CPU) allocates at init, byte for byte, on every ep layout.
TEST(AccountingEp, StateRowsAreTheReplayedInit) {
  for (const Layout k : kLayouts) {
    const Config c = small_moe(k.dp, k.ep, k.zero);
    const auto a = jobs::account(c, static_cast<int>(k.dp), "");
    double state = 0;
    for (const auto& it : a.memory)
      if (it.name == "parameters" || it.name == "gradients" || it.name == "gradient_shard" || it.name == "optimizer_state")
        state += it.bytes;
    const auto phases = jobs::predict_memory_phases(c, static_cast<int>(k.dp), false, 0);
    ASSERT_EQ(phases.phases.front().phase, "init");
    EXPECT_DOUBLE_EQ(state, phases.phases.front().bytes) << "dp " << k.dp << " zero " << static_cast<int>(k.zero);
  }
}

// The table is the rank's memory at the start of the backward; the replayed peak comes later in
// the backward, when the per-bucket gradients (one process per ep rank, zero2: 4 B per stored
// parameter) have been allocated. Where the state dominates (8 tokens per rank), the table's
// total plus those gradients is within 5% of the replayed peak; the rest is one MoE block's
// backward temporaries, which the table has no row for (docs/moe.md, "Outputs"). fsdp's peak
// also holds a unit's full-size gradients and its
// regathered weights, which the table does not list (not compared).
TEST(AccountingEp, TotalNearTheReplayedPeakWhenStateDominates) {
  for (const Layout k : kLayouts) {
    if (k.zero == ZeroLevel::fsdp) continue;
    Config c = small_moe(k.dp, k.ep, k.zero);
    c.model.context_length = 8;
    const auto a = jobs::account(c, static_cast<int>(k.dp), "");
    const bool lazy = k.dp == k.ep || k.zero == ZeroLevel::zero2;
    const double total = a.peak_bytes + (lazy ? 4 * store_counts(c).held : 0.0);
    const double peak = jobs::predict_memory_phases(c, static_cast<int>(k.dp), false, 0).peak;
    EXPECT_NEAR(total / peak, 1.0, 0.05) << "dp " << k.dp << " zero " << static_cast<int>(k.zero) << ": table "
                                         << total << ", replay " << peak;
    EXPECT_LT(total, peak);   // the backward's temporaries the table leaves out
  }
}

// With 512 tokens a rank in 8 MoE blocks (flash attention, no checkpointing) the activations
// are half of the replayed peak, and the table counts an MoE block's routed rows, routing and
// expert activations (docs/moe.md, "Outputs"): its total, plus the per-bucket gradients the
// backward allocates where they are lazy (as above), is within 6% under the replayed peak (the
// rest: one MoE block's backward temporaries). Counting each MoE block as a dense block of d_ff
// (the table before) gave 0.62 of the peak here.
TEST(AccountingEp, MoeActivationsNearTheReplayedPeak) {
  for (const Layout k : kLayouts) {
    if (k.zero == ZeroLevel::fsdp) continue;
    Config c = small_moe(k.dp, k.ep, k.zero);
    c.model.num_layers = 8;
    c.model.context_length = 512;
    c.model.attention = AttentionImpl::flash;
    const auto a = jobs::account(c, static_cast<int>(k.dp), "");
    const bool lazy = k.dp == k.ep || k.zero == ZeroLevel::zero2;
    const double total = a.peak_bytes + (lazy ? 4 * store_counts(c).held : 0.0);
    const double peak = jobs::predict_memory_phases(c, static_cast<int>(k.dp), false, 0).peak;
    const double act = item(a, "activations");
    const std::string what = "dp " + std::to_string(k.dp) + " ep " + std::to_string(k.ep) + " zero " +
                             std::to_string(static_cast<int>(k.zero)) + ": table " + std::to_string(total) +
                             " (activations " + std::to_string(act) + "), replay " + std::to_string(peak);
    EXPECT_GT(act, 0.4 * peak) << "the activations dominate; " << what;
    EXPECT_LT(total, peak) << what;
    EXPECT_GT(total, 0.94 * peak) << what;
  }
}

// parallel.ep_exchange = copy-engine (docs/moe.md, "Communication"): the ep all-to-all's receive
// window holds, per other ep rank, one micro-batch's routed rows (N tokens x top-k x d in the
// compute dtype), plus two 8-byte flags per rank, from initialisation on: every replayed phase
// grows by exactly that, and the accounting lists the slots. Counted here from the shapes: 1
// sequence of 16 tokens a rank, top-2, d 64, bf16 on CUDA (2 B).
TEST(AccountingEp, EpExchangeWindowIsPredicted) {
  for (const Layout k : {Layout{2, 2, ZeroLevel::none}, Layout{4, 2, ZeroLevel::zero2}, Layout{4, 4, ZeroLevel::fsdp}}) {
    for (const double capacity : {0.0, 0.5}) {
      Config c = small_moe(k.dp, k.ep, k.zero);
      c.parallel.device = DeviceChoice::cuda;
      c.precision.mode = PrecisionMode::bf16;
      c.model.moe_capacity_factor = capacity;
      const int world = static_cast<int>(k.dp);
      const auto nccl = jobs::predict_memory_phases(c, world, true, 0);
      for (const auto& it : jobs::account(c, world, "").memory) EXPECT_NE(it.name, "ep_exchange_window");
      c.parallel.ep_exchange = EpExchange::copy_engine;
      const auto ce = jobs::predict_memory_phases(c, world, true, 0);
      // Dropless: 16 x 2 rows; capacity 0.5: ceil(0.5 x 16 x 2 / 8) = 2 per expert and sequence, 8 x 2 rows.
      const double rows = capacity > 0 ? 16 : 32, slot = rows * 64 * 2;
      const double ep = static_cast<double>(k.ep), window = (ep - 1) * slot + ep * 2 * 8;
      const std::string what = "dp " + std::to_string(k.dp) + " ep " + std::to_string(k.ep) + " capacity " +
                               std::to_string(capacity);
      EXPECT_DOUBLE_EQ(item(jobs::account(c, world, ""), "ep_exchange_window"), (ep - 1) * slot) << what;
      ASSERT_EQ(ce.phases.size(), nccl.phases.size()) << what;
      for (std::size_t i = 0; i < ce.phases.size(); ++i)
        EXPECT_DOUBLE_EQ(ce.phases[i].bytes - nccl.phases[i].bytes, window) << what << " " << ce.phases[i].phase;
      EXPECT_DOUBLE_EQ(ce.peak - nccl.peak, window) << what;
    }
  }
}
