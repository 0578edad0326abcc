// The planner (jobs/plan/): the alpha-beta collective model and its fit, the calibration file,
// pinned step predictions of measured decks with the shipped H200 calibration (docs/planner.md,
// "Validation"), and the layout search's ranking (a layout that does not fit comes last).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "lmscale/core/error.h"
#include "lmscale/io/presets.h"
#include "lmscale/jobs/plan/calibration.h"
#include "lmscale/jobs/plan/cluster.h"
#include "lmscale/jobs/plan/collective_model.h"
#include "lmscale/jobs/plan/layout_search.h"
#include "lmscale/jobs/plan/step_model.h"
#include "lmscale/parallel/pipeline.h"
#include "lmscale/parallel/spec.h"

using namespace lmscale;
using namespace lmscale::jobs::plan;

namespace {

std::string repo_file(const std::string& rel) {
  return (std::filesystem::path(LMSCALE_SOURCE_DIR) / rel).string();
}

Calibration h200() { return read_calibration(repo_file("inputs/calibration/h200.ini")); }

Config xl(std::int64_t dp) {
  Config c;
  c.model.size = "xl";
  c.model.vocab_size = 10000;
  c.model.d_model = 1600;
  c.model.d_ff = 6400;
  c.model.num_layers = 48;
  c.model.num_heads = 25;
  c.model.context_length = 512;
  c.model.attention = AttentionImpl::flash;
  c.precision.mode = PrecisionMode::bf16;
  c.parallel.dp = dp;
  return c;
}

}  // namespace

TEST(CollectiveModel, RingAndTreeFormulas) {
  const Link l{10e-6, 100e9};
  // Ring all-reduce over 4 ranks: 6 steps, 2 x 3/4 of the buffer.
  EXPECT_NEAR(ring_time(CollectiveOp::all_reduce, 4, 1e9, l), 6 * 10e-6 + 1.5 * 1e9 / 100e9, 1e-12);
  EXPECT_NEAR(ring_time(CollectiveOp::all_gather, 4, 1e9, l), 3 * 10e-6 + 0.75 * 1e9 / 100e9, 1e-12);
  EXPECT_EQ(ring_time(CollectiveOp::all_reduce, 1, 1e9, l), 0);
  EXPECT_NEAR(tree_all_reduce_time(1024, 1e3, l), 2 * 10 * 10e-6 + 2 * 1e3 / 100e9, 1e-12);
  // Small messages over many ranks take the tree; large ones over few ranks the ring.
  Cluster c = cluster_preset(ClusterPreset::h100_nvlink_ib400);
  EXPECT_EQ(collective_time(CollectiveOp::all_reduce, 1e3, {1024, 8}, c).algorithm, "tree");
  EXPECT_EQ(collective_time(CollectiveOp::all_reduce, 1e10, {16, 8}, c).algorithm, "ring");
  EXPECT_TRUE(collective_time(CollectiveOp::all_reduce, 1e10, {16, 8}, c).inter_node);
  EXPECT_FALSE(collective_time(CollectiveOp::all_reduce, 1e10, {8, 8}, c).inter_node);
}

TEST(CollectiveModel, FitRecoversAlphaBeta) {
  const Link truth{7e-6, 250e9};
  std::vector<std::pair<double, double>> pts;
  for (double s = 1 << 10; s <= (1 << 30); s *= 8) pts.emplace_back(s, ring_time(CollectiveOp::all_reduce, 2, s, truth));
  const Link fit = fit_ring_link(CollectiveOp::all_reduce, 2, pts);
  EXPECT_NEAR(fit.alpha_s, truth.alpha_s, 1e-9);
  EXPECT_NEAR(fit.bus_bytes_per_s / truth.bus_bytes_per_s, 1.0, 1e-6);
  EXPECT_THROW(fit_ring_link(CollectiveOp::all_reduce, 2, {{1e6, 1e-3}}), UsageError);
  // Times that shrink with the size (a noisy, loaded host): no latency term, and the largest
  // message alone sets the bandwidth, so the model reproduces that message's time.
  const std::vector<std::pair<double, double>> noisy{{4096, 5e-3}, {4194304, 9e-4}};
  const Link fallback = fit_ring_link(CollectiveOp::all_reduce, 2, noisy);
  EXPECT_EQ(fallback.alpha_s, 0.0);
  EXPECT_NEAR(ring_time(CollectiveOp::all_reduce, 2, 4194304, fallback), 9e-4, 1e-12);
}

TEST(Calibration, RoundTripAndErrors) {
  const Calibration c = h200();
  EXPECT_EQ(c.device, "NVIDIA H200");
  EXPECT_EQ(parse_calibration(calibration_text(c), "text"), c);
  // Interpolation in log(FLOPs), the last rate above, sqrt(work) below the first point.
  EXPECT_NEAR(c.gemm.rate(1.0486e10), 484e12, 1e6);
  EXPECT_NEAR(c.gemm.rate(1e13), 841e12, 1e6);
  EXPECT_NEAR(c.gemm.rate(1.0486e10 / 4), 242e12, 1e6);
  EXPECT_THROW(parse_calibration("[gemm]\npoints = 1e9:100\n", "x.ini"), UsageError);   // keys missing
  try {
    parse_calibration("[device]\npeak_tflops = fast\n", "x.ini");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("x.ini:2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_calibration("[gemm]\nunknown = 1\n", "x.ini"), UsageError);
}

// Pinned predictions (docs/planner.md, "Validation": measured 67.3, 70.5 and 79.2 ms on 2 H200).
TEST(StepModel, PinnedPredictions) {
  const Calibration cal = h200();
  Config one = xl(1);
  const Cluster c = resolve_cluster(one, cal);
  const StepPrediction p1 = predict_step(one, 4, 1, c, cal);
  EXPECT_NEAR(p1.step_s * 1e3, 70.54, 0.05);
  EXPECT_NEAR(p1.optimizer_s * 1e3, 17.42, 0.05);
  Config z2 = xl(2);
  z2.parallel.zero = ZeroLevel::zero2;
  z2.parallel.ddp = DdpKind::bucketed;
  z2.parallel.grad_exchange = GradExchange::copy_engine;
  EXPECT_NEAR(predict_step(z2, 8, 2, c, cal).step_s * 1e3, 72.70, 0.05);
  Config fsdp = xl(2);
  fsdp.parallel.zero = ZeroLevel::fsdp;
  const StepPrediction pf = predict_step(fsdp, 8, 2, c, cal);
  EXPECT_NEAR(pf.step_s * 1e3, 78.31, 0.05);
  EXPECT_GT(pf.overlapped_comm_s, 0);
  // Inter-node data parallelism costs more than intra-node at the same degree.
  Config wide = xl(16);
  wide.parallel.zero = ZeroLevel::fsdp;
  EXPECT_GT(predict_step(wide, 64, 16, c, cal).exposed_comm_s + predict_step(wide, 64, 16, c, cal).contention_s,
            pf.exposed_comm_s + pf.contention_s);
}

// The moe-1b preset (docs/moe.md: d 1024, 12 blocks, 8 experts of 2816, top-2, every block) at
// 1024 tokens per sequence.
Config moe_1b(std::int64_t dp, std::int64_t ep) {
  Config c = xl(dp);
  c.model.size = "moe-1b";
  io::apply_preset(c, {});
  c.model.context_length = 1024;
  c.parallel.ep = ep;
  return c;
}

double op_flops(const StepPrediction& p, const std::string& op) {
  double f = 0;
  for (const auto& o : p.compute)
    if (o.op == op) f += o.flops;
  return f;
}

// An MoE block's FFN is the router and k experts' SwiGLU per token (no dense FFN); with ep = 2
// each MoE block adds four all-to-alls of the rank's n k rows of d (dispatch and combine, forward
// and backward) and the dense gradients' all-reduce over the ep group.
TEST(StepModel, MixtureOfExpertsAndExpertParallelism) {
  const Calibration cal = h200();
  const Config one = moe_1b(1, 1);
  const Cluster c = resolve_cluster(one, cal);
  const StepPrediction p1 = predict_step(one, 8, 1, c, cal);
  const double n = 8 * 1024.0, d = 1024, Fe = 2816, k = 2, E = 8, L = 12;
  EXPECT_NEAR(op_flops(p1, "gemm experts"), 3 * L * 3 * 2 * n * k * d * Fe, 1e-6 * op_flops(p1, "gemm experts"));
  EXPECT_NEAR(op_flops(p1, "gemm router"), 3 * L * 2 * n * d * E, 1e-6 * op_flops(p1, "gemm router"));
  EXPECT_EQ(op_flops(p1, "gemm w1 w3"), 0);
  EXPECT_EQ(op_flops(p1, "gemm w2"), 0);
  for (const auto& cm : p1.comm) ADD_FAILURE() << "one GPU communicates: " << cm.collective;
  // ep = 2 on 2 GPUs at 8 sequences per GPU: the same compute per GPU (balanced routing), plus
  // the all-to-alls on the critical path.
  const Config two = moe_1b(2, 2);
  const StepPrediction p2 = predict_step(two, 16, 2, c, cal);
  EXPECT_NEAR(op_flops(p2, "gemm experts"), op_flops(p1, "gemm experts"), 1e-6 * op_flops(p1, "gemm experts"));
  double a2a_s = -1, a2a_count = 0, a2a_bytes = 0, ep_reduce = -1;
  for (const auto& cm : p2.comm) {
    if (cm.collective == "all-to-all") a2a_s = cm.seconds, a2a_count = cm.calls, a2a_bytes = cm.bytes_per_call;
    if (cm.axis == "ep" && cm.collective == "all-reduce") ep_reduce = cm.seconds;
  }
  EXPECT_EQ(a2a_count, 4 * L);
  EXPECT_EQ(a2a_bytes, n * k * d * 2);
  // Pairwise exchange on 2 ranks: one step, half the buffer leaves the rank.
  EXPECT_NEAR(a2a_s, 4 * L * (c.intra.alpha_s + 0.5 * a2a_bytes / c.intra.bus_bytes_per_s), 1e-9);
  EXPECT_GT(ep_reduce, 0);
  EXPECT_GE(p2.exposed_comm_s, a2a_s);   // the all-to-alls are on the critical path
  // Each rank holds half the experts: less optimizer work; each local expert takes twice the rows
  // (larger GEMM calls, a higher calibrated rate): less expert GEMM time for the same FLOPs.
  EXPECT_LT(p2.optimizer_s, p1.optimizer_s);
  double experts1 = 0, experts2 = 0;
  for (const auto& o : p1.compute) experts1 += o.op == "gemm experts" ? o.seconds : 0;
  for (const auto& o : p2.compute) experts2 += o.op == "gemm experts" ? o.seconds : 0;
  EXPECT_LT(experts2, experts1);
}

// plan.moe_rank_imbalance: under ep every block waits for its busiest rank, whose experts take
// that factor times the mean rows; their products are timed at that size (FLOPs stay the mean's)
// and the all-to-alls carry that many rows. ep = 1 has no ranks to wait for: unchanged.
TEST(StepModel, ExpertParallelRankImbalance) {
  const Calibration cal = h200();
  Config two = moe_1b(2, 2);
  const Cluster c = resolve_cluster(two, cal);
  const StepPrediction balanced = predict_step(two, 16, 2, c, cal);
  two.plan.moe_rank_imbalance = 1.25;
  const StepPrediction p = predict_step(two, 16, 2, c, cal);
  const double n = 8 * 1024.0, d = 1024, Fe = 2816, k = 2, E = 8, L = 12, ep = 2;
  EXPECT_NEAR(op_flops(p, "gemm experts"), op_flops(balanced, "gemm experts"), 1e-6 * op_flops(p, "gemm experts"));
  auto gemm_s = [&](double f) { return f / (cal.gemm.rate(f) * c.bf16_flops / cal.peak_flops); };
  const double busiest_call = 1.25 * 2 * (n * k * ep / E) * d * Fe;
  double experts = 0, a2a_bytes = 0, a2a_s = 0;
  for (const auto& o : p.compute) experts += o.op == "gemm experts" ? o.seconds : 0;
  for (const auto& cm : p.comm)
    if (cm.collective == "all-to-all") a2a_bytes = cm.bytes_per_call, a2a_s = cm.seconds;
  // forward 1 + backward 2 passes, 12 blocks, E / ep local experts, 3 products each.
  EXPECT_NEAR(experts, 3 * L * (E / ep) * 3 * gemm_s(busiest_call), 1e-9);
  EXPECT_EQ(a2a_bytes, 1.25 * n * k * d * 2);
  EXPECT_NEAR(a2a_s, 4 * L * (c.intra.alpha_s + 0.5 * a2a_bytes / c.intra.bus_bytes_per_s), 1e-9);
  EXPECT_GT(p.step_s, balanced.step_s);
  Config one = moe_1b(1, 1);
  const double one_balanced = predict_step(one, 8, 1, c, cal).step_s;
  one.plan.moe_rank_imbalance = 1.25;
  EXPECT_EQ(predict_step(one, 8, 1, c, cal).step_s, one_balanced);
}

// fsdp with the optimizer offloaded (parallel/offloaded_shards.h): the host update (30 B per owned
// parameter, the node's ranks sharing the calibration's host rate) overlaps the first forward, and
// only what outlasts it adds to the step. xl on 2 H200: measured 466.0 and 748.5 ms in two calls
// (docs/performance.md, "CPU offload"); the host update of 1.0e9 parameters per rank, 2 ranks at
// 123 GB/s: 487 ms.
TEST(StepModel, OffloadedOptimizerOverlapsTheForward) {
  const Calibration cal = h200();
  Config fsdp = xl(2);
  fsdp.parallel.zero = ZeroLevel::fsdp;
  const Cluster c = resolve_cluster(fsdp, cal);
  Config off = fsdp;
  off.parallel.offload = OffloadMode::optimizer;
  const StepPrediction in_memory = predict_step(fsdp, 8, 2, c, cal), offloaded = predict_step(off, 8, 2, c, cal);
  double host_s = -1;
  for (const auto& op : offloaded.compute)
    if (op.op.rfind("host optimizer", 0) == 0) host_s = op.seconds;
  const double owned = 1998235200.0 / 2;   // xl's parameters (bench-model's `parameters`) over 2 ranks
  EXPECT_NEAR(host_s, 2 * owned * 30 / 123e9, 0.01 * host_s);
  EXPECT_GT(offloaded.step_s, in_memory.step_s);
  EXPECT_NEAR(offloaded.step_s * 1e3, 540.5, 0.5);
  // No host rate in the calibration: the layout search leaves offload out.
  Calibration no_host = cal;
  no_host.host_adamw_bytes_per_s = 0;
  for (const auto& k : search_layouts(xl(0), 8, 2, c, no_host, SearchSpace{false, false, false, 2}))
    EXPECT_EQ(k.cfg.parallel.offload, OffloadMode::none) << k.layout;
}

// With 76 GiB per GPU (issue 39's bound for an 80 GB card after the CUDA context and NCCL) the 8b
// step fits only with the optimizer offloaded: without it, fsdp needs 78.5 GiB even with every
// block recomputed (the deck's notes), with it 40.4 (the deck as measured: 69.92 GiB, which keeps
// 7 blocks' activations). The search ranks the offloaded fsdp layout first.
TEST(LayoutSearch, OffloadMakesTheLeaderboardStepFit) {
  const Calibration cal = h200();
  Config deck = xl(0);
  deck.model.size = "8b";
  deck.model.vocab_size = 151936;
  deck.model.d_model = 4096;
  deck.model.d_ff = 11008;
  deck.model.num_layers = 34;
  deck.model.num_heads = 32;
  deck.model.context_length = 32768;
  deck.model.ce_chunk_rows = 883;
  Cluster c = resolve_cluster(deck, cal);
  c.memory_bytes = 76.0 * (1u << 30);
  auto layouts = search_layouts(deck, 2, 2, c, cal, SearchSpace{false, false, false, 2});
  rank_layouts(layouts);
  ASSERT_FALSE(layouts.empty());
  ASSERT_TRUE(layouts.front().fits) << layouts.front().layout;
  EXPECT_EQ(layouts.front().cfg.parallel.offload, OffloadMode::optimizer) << layouts.front().layout;
}

// fsdp x ep (dp 4 x ep 2, grad_accum 2): fsdp reduce-scatters every micro-batch's gradients, so
// the dense gradients' all-reduce over ep runs once per micro-batch (zero2 x ep: once per step,
// the same bytes); the unit gathers run over the expert_dp group of 2 and hold E/ep experts.
TEST(StepModel, FsdpWithExpertParallelismSumsEveryMicroBatch) {
  const Calibration cal = h200();
  Config fsdp = moe_1b(4, 2);
  fsdp.parallel.zero = ZeroLevel::fsdp;
  fsdp.parallel.ddp = DdpKind::none;
  fsdp.train.grad_accum = 2;
  Config zero2 = fsdp;
  zero2.parallel.zero = ZeroLevel::zero2;
  const Cluster c = resolve_cluster(fsdp, cal);
  auto ep_reduce = [&](const Config& cfg) {
    for (const auto& cm : predict_step(cfg, 32, 4, c, cal).comm)
      if (cm.axis == "ep" && cm.collective == "all-reduce") return cm;
    ADD_FAILURE() << "no all-reduce over ep";
    return CommTime{};
  };
  const CommTime f = ep_reduce(fsdp), z = ep_reduce(zero2);
  EXPECT_EQ(f.calls, 2);
  EXPECT_EQ(z.calls, 1);
  EXPECT_EQ(f.bytes_per_call, z.bytes_per_call);
  EXPECT_NEAR(f.seconds, 2 * z.seconds, 1e-12);
  bool gathers = false;
  for (const auto& cm : predict_step(fsdp, 32, 4, c, cal).comm) gathers |= cm.purpose == "fsdp unit gathers";
  EXPECT_TRUE(gathers);
}

// parallel.fsdp_gather_dtype = fp8 (xl in fp8 under fsdp on 8 ranks): the block units' gathers
// carry 1 B per element instead of bf16's 2 (same calls), each after an exposed all-reduce of the
// block's 7 fp32 amaxes.
TEST(StepModel, FsdpFp8GathersHalveTheBlockGathers) {
  const Calibration cal = h200();
  Config bf16 = xl(8);
  bf16.precision.mode = PrecisionMode::fp8;
  bf16.parallel.zero = ZeroLevel::fsdp;
  Config fp8 = bf16;
  fp8.parallel.fsdp_gather_dtype = FsdpGatherDtype::fp8;
  const Cluster c = resolve_cluster(bf16, cal);
  auto find = [&](const Config& cfg, const std::string& purpose) {
    for (const auto& cm : predict_step(cfg, 64, 8, c, cal).comm)
      if (cm.purpose == purpose) return cm;
    return CommTime{};
  };
  const CommTime g2 = find(bf16, "fsdp unit gathers"), g1 = find(fp8, "fsdp unit gathers");
  EXPECT_EQ(g1.calls, g2.calls);
  EXPECT_DOUBLE_EQ(g1.bytes_per_call, g2.bytes_per_call / 2);
  EXPECT_LT(g1.seconds, g2.seconds);
  const CommTime am = find(fp8, "fsdp FP8 gathers' amaxes");
  EXPECT_EQ(am.calls, g1.calls);
  EXPECT_DOUBLE_EQ(am.bytes_per_call, 28.0);
  EXPECT_GT(am.exposed_s, 0.0);
  EXPECT_EQ(find(bf16, "fsdp FP8 gathers' amaxes").calls, 0);
}

// For an MoE model the search adds ep (dividing dp and the 8 experts) to each data-parallel
// layout; a dense model gets none. MoE refuses tp and pp (docs/moe.md): those layouts are dropped.
TEST(LayoutSearch, ExpertParallelLayoutsForMoE) {
  const Calibration cal = h200();
  const Config moe = moe_1b(0, 1);
  const Cluster c = resolve_cluster(moe, cal);
  bool ep2 = false, ep4 = false;
  for (const auto& k : search_layouts(moe, 32, 4, c, cal, SearchSpace{false, false, false, 2})) {
    EXPECT_EQ(k.tp, 1) << k.layout;
    EXPECT_EQ(k.pp, 1) << k.layout;
    ep2 |= k.cfg.parallel.ep == 2;
    ep4 |= k.cfg.parallel.ep == 4;
    if (k.cfg.parallel.ep > 1) {
      EXPECT_NE(k.family.find("ep"), std::string::npos) << k.layout;
    }
  }
  EXPECT_TRUE(ep2);
  EXPECT_TRUE(ep4);
  for (const auto& k : search_layouts(xl(0), 8, 4, c, cal, SearchSpace{false, false, false, 2}))
    EXPECT_EQ(k.cfg.parallel.ep, 1) << k.layout;
}

TEST(LayoutSearch, ANonFittingLayoutRanksLast) {
  const Calibration cal = h200();
  Config deck = xl(0);
  Cluster c = resolve_cluster(deck, cal);
  c.memory_bytes = 30.0 * (1u << 30);   // a 30 GiB card: xl without sharding does not fit
  auto layouts = search_layouts(deck, 8, 2, c, cal, SearchSpace{false, false, false, 2});
  ASSERT_GT(layouts.size(), 3u);
  rank_layouts(layouts);
  bool seen_unfit = false;
  for (const auto& k : layouts) {
    if (!k.fits) seen_unfit = true;
    EXPECT_FALSE(seen_unfit && k.fits) << "a fitting layout after one that does not fit: " << k.layout;
  }
  EXPECT_TRUE(seen_unfit);
  EXPECT_TRUE(layouts.front().fits);
  for (std::size_t i = 1; i < layouts.size() && layouts[i].fits; ++i)
    EXPECT_GE(layouts[i - 1].step.tokens_per_s_per_gpu, layouts[i].step.tokens_per_s_per_gpu);
}

// ZB-H1 (parallel::pipeline_idle): the same compute and optimizer as 1F1B, and a bubble shorter by
// the deferred weight gradients. With pp = 2 and M >= 2 micro-batches 1F1B idles f + b + w and
// ZB-H1 f + b - w, so the difference is 2 w, where w (one micro-batch's W pass on the stage) is
// the blocks' dW GEMMs: a third of the q, k, v, out, w1, w2, w3 ops' time (forward, dx, dW each
// at the forward's FLOPs). With M = 1 no W can move ahead of the last gradient: w.
TEST(StepModel, ZeroBubbleSchedulesTheWeightGradientsIntoTheBubble) {
  const Calibration cal = h200();
  Config base = xl(1);
  base.parallel.pp = 2;
  const Cluster c = resolve_cluster(base, cal);
  // Checkpointing adds recompute (its own op), never W: the relation holds with every-k too.
  for (Checkpointing ac : {Checkpointing::none, Checkpointing::every_k})
  for (std::int64_t M : {1, 2, 8}) {
    Config deck = base;
    deck.train.activation_checkpointing = ac;
    deck.train.checkpoint_k = 1;
    Config one = deck, zb = deck;
    one.parallel.microbatches = zb.parallel.microbatches = M;
    one.parallel.schedule = PipelineSchedule::one_f_one_b;
    zb.parallel.schedule = PipelineSchedule::zb_h1;
    const StepPrediction p1 = predict_step(one, 8, 2, c, cal), pz = predict_step(zb, 8, 2, c, cal);
    double block_gemms = 0;
    for (const auto& o : pz.compute)
      if (o.op == "gemm qkv" || o.op == "gemm out" || o.op == "gemm w1 w3" || o.op == "gemm w2") block_gemms += o.seconds;
    const double w = block_gemms / 3 / static_cast<double>(M);
    EXPECT_GT(w, 0);
    EXPECT_DOUBLE_EQ(pz.compute_s, p1.compute_s) << "M " << M;
    EXPECT_DOUBLE_EQ(pz.optimizer_s, p1.optimizer_s) << "M " << M;
    EXPECT_NEAR(p1.bubble_s - pz.bubble_s, (M >= 2 ? 2 : 1) * w, 1e-12) << "M " << M;
    EXPECT_LT(pz.step_s, p1.step_s) << "M " << M;
  }
  // The shared formula by hand: ZB-H1 idles (p - 1)(f + b) - (min(M, p) - 1) w.
  EXPECT_DOUBLE_EQ(parallel::pipeline_idle(PipelineSchedule::zb_h1, 4, 8, 1, 1, 1.2, 0.8), 3 * 2.2 - 3 * 0.8);
  EXPECT_DOUBLE_EQ(parallel::pipeline_idle(PipelineSchedule::zb_h1, 4, 2, 1, 1, 1.2, 0.8), 3 * 2.2 - 1 * 0.8);
  EXPECT_DOUBLE_EQ(parallel::pipeline_idle(PipelineSchedule::interleaved, 4, 8, 2, 1, 1, 1), 4.5);
  EXPECT_DOUBLE_EQ(parallel::pipeline_idle(PipelineSchedule::gpipe, 1, 8, 1, 1, 1, 1), 0.0);
  // The theory the report and the accounting print per schedule.
  EXPECT_DOUBLE_EQ(parallel::schedule_theory_bubble(PipelineSchedule::zb_h1, 2, 8, 1).fraction, 1.0 / 25.0);
  EXPECT_DOUBLE_EQ(parallel::schedule_theory_bubble(PipelineSchedule::one_f_one_b, 2, 8, 1).fraction, 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(parallel::schedule_theory_bubble(PipelineSchedule::interleaved, 4, 8, 2).fraction, 3.0 / 11.0 / 2.0);
}

// The search tries ZB-H1 beside 1F1B for every pipeline layout, and for xl on 2 GPUs at batch 8
// it ranks ZB-H1 over 2 micro-batches of 4 first among the pipelines, as measured on 2 H100
// (docs/performance.md, "Pipeline parallelism": 78 ms against 88-116 for the others).
TEST(LayoutSearch, ZeroBubblePipelinesAreSearched) {
  const Calibration cal = h200();
  const Config deck = xl(0);
  const Cluster c = resolve_cluster(deck, cal);
  auto layouts = search_layouts(deck, 8, 2, c, cal, SearchSpace{false, false, false, 2});
  rank_layouts(layouts);
  int zb = 0, one_f_one_b = 0;
  const Candidate* best_pp = nullptr;
  for (const auto& k : layouts) {
    if (k.pp < 2) continue;
    if (!best_pp) best_pp = &k;
    zb += k.cfg.parallel.schedule == PipelineSchedule::zb_h1;
    one_f_one_b += k.cfg.parallel.schedule == PipelineSchedule::one_f_one_b;
  }
  EXPECT_GT(zb, 0);
  EXPECT_EQ(zb, one_f_one_b);
  ASSERT_NE(best_pp, nullptr);
  EXPECT_EQ(best_pp->cfg.parallel.schedule, PipelineSchedule::zb_h1) << best_pp->layout;
  EXPECT_EQ(best_pp->cfg.parallel.microbatches, 2) << best_pp->layout;
}
