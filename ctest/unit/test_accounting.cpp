// Accounting (jobs/predict/accounting.h) against hand-counted numbers: parameter bytes, sharded optimizer
// state, activations of the xl model at batch 4 x 512 in bf16 (the device measured a 34.624 GiB
// peak for this deck on an H100, gradients per bucket; the prediction must be within 2%), and
// communication volumes.
#include <gtest/gtest.h>

#include <cmath>

#include "lmscale/jobs/predict/accounting.h"
#include "lmscale/core/error.h"
#include "lmscale/jobs/dispatch.h"
#include "lmscale/jobs/predict/memory_model.h"
#include "lmscale/jobs/predict/planned_device.h"
#include "lmscale/parallel/grad_buckets.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/parallel/copy_engine_all_reduce.h"

using namespace lmscale;

namespace {
Config xl_bf16() {
  Config c;
  c.run.job = JobKind::bench_model;
  c.model.size = "xl";
  c.model.vocab_size = 10000;
  c.model.d_model = 1600;
  c.model.d_ff = 6400;
  c.model.num_layers = 48;
  c.model.num_heads = 25;
  c.model.context_length = 512;
  c.precision.mode = PrecisionMode::bf16;
  c.bench.batch_size = 4;
  return c;
}
double item(const jobs::Accounting& a, const std::string& n) {
  for (const auto& i : a.memory)
    if (i.name == n) return i.bytes;
  return -1;
}
}  // namespace

TEST(Accounting, XlBf16OneGpuMatchesTheMeasuredPeak) {
  const auto a = jobs::account(xl_bf16(), 1, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(a.parameters, 1998235200);
  EXPECT_DOUBLE_EQ(item(a, "parameters"), 4.0 * 1998235200);
  EXPECT_DOUBLE_EQ(item(a, "parameters_lowp"), 2.0 * 1998235200);
  EXPECT_DOUBLE_EQ(item(a, "optimizer_state"), 8.0 * 1998235200);
  // per layer: (8*1600 + 3*6400) * 2048 * 2 B + 2*2048*4 + 4*25*512*512*2
  EXPECT_DOUBLE_EQ(item(a, "activations"), 48.0 * ((8 * 1600 + 3 * 6400) * 2048.0 * 2 + 2 * 2048 * 4 + 4 * 25 * 512.0 * 512 * 2));
  EXPECT_DOUBLE_EQ(item(a, "gradients"), 0.0);   // allocated during the backward, per bucket
  const double measured = 34.624 * (1u << 30);
  EXPECT_NEAR(a.peak_bytes, measured, 0.02 * measured);
  EXPECT_EQ(a.comm_bytes_per_step, 0.0);
  EXPECT_NEAR(a.flops_per_step, 6.0 * (48.0 * (4 * 1600 * 1600 + 3 * 1600 * 6400) + 10000.0 * 1600) * 2048 +
                                    12.0 * 48 * 512 * 1600 * 2048, 1.0);
}

// zero1 reduce-scatters the fp32 gradients (half the all-reduce) and all-gathers the bf16 working
// copy (2 bytes per parameter) and the fp32 norm weights ((2L+1) d = 97 x 1600): about 3/4 of
// DDP's volume in bf16, the same in fp32.
TEST(Accounting, Zero1ShardsOptimizerStateAndGathersTheWorkingCopy) {
  Config c = xl_bf16();
  c.bench.batch_size = 8;
  c.parallel.ddp = DdpKind::bucketed;
  const auto ddp = jobs::account(c, 2, "");
  c.parallel.zero = ZeroLevel::zero1;
  const auto z = jobs::account(c, 2, "");
  EXPECT_DOUBLE_EQ(item(z, "optimizer_state"), item(ddp, "optimizer_state") / 2);
  EXPECT_DOUBLE_EQ(ddp.comm_bytes_per_step, 2 * 0.5 * 4 * 1998235200.0);
  EXPECT_DOUBLE_EQ(z.comm_bytes_per_step, 0.5 * 4 * 1998235200.0 + 0.5 * 2 * 1998235200.0 + 0.5 * 4 * 97 * 1600);
  EXPECT_EQ(ddp.local_batch, 4);
  c.precision.mode = PrecisionMode::fp32;
  c.parallel.zero = ZeroLevel::none;
  const auto ddp32 = jobs::account(c, 2, "");
  c.parallel.zero = ZeroLevel::zero2;
  EXPECT_DOUBLE_EQ(jobs::account(c, 2, "").comm_bytes_per_step, ddp32.comm_bytes_per_step);
}

// parallel.grad_exchange = copy-engine (zero2): the receive window holds one slot of the largest
// shard per other rank and a signal flag per bucket and rank, from initialisation on; the
// accounting lists the slots and the replayed peaks of every phase grow by exactly the window.
TEST(Accounting, CopyEngineWindowIsOneShardPerOtherRank) {
  Config c = xl_bf16();
  c.bench.batch_size = 8;
  c.parallel.device = DeviceChoice::cuda;
  c.parallel.zero = ZeroLevel::zero2;
  const auto nccl = jobs::account(c, 2, "");
  const auto nccl_mem = jobs::predict_memory_phases(c, 2, true, 0);
  c.parallel.grad_exchange = GradExchange::copy_engine;
  const auto ce = jobs::account(c, 2, "");
  const auto ce_mem = jobs::predict_memory_phases(c, 2, true, 0);
  const double P = 1998235200.0;
  EXPECT_DOUBLE_EQ(item(ce, "gradient_exchange_window"), 4 * P / 2);
  EXPECT_DOUBLE_EQ(item(ce, "gradient_shard"), item(nccl, "gradient_shard"));
  // A signal flag (8 bytes) per bucket of the store's layout and rank.
  const auto nb = static_cast<double>(parallel::gradient_buckets(model::parameter_layout(model::ModelDims::from(c.model)),
                                                              c.parallel.bucket_mb * 1024 * 1024, 4)
                                          .size());
  ASSERT_EQ(ce_mem.phases.size(), nccl_mem.phases.size());
  for (std::size_t i = 0; i < ce_mem.phases.size(); ++i)
    EXPECT_DOUBLE_EQ(ce_mem.phases[i].bytes - nccl_mem.phases[i].bytes, 4 * P / 2 + 2 * nb * 8) << ce_mem.phases[i].phase;
  // 3 ranks: 2 slots of the first (largest) shard.
  const auto three = jobs::predict_memory_phases(c, 3, true, 2);
  c.parallel.grad_exchange = GradExchange::nccl;
  const auto three_nccl = jobs::predict_memory_phases(c, 3, true, 2);
  EXPECT_DOUBLE_EQ(three.peak - three_nccl.peak, 2 * 4 * std::ceil(P / 3) + 3 * nb * 8);
}

// parallel.grad_exchange = copy-engine with bucketed DDP: the window holds, per other rank, this
// rank's part (ceil(numel / N) on rank 0) of every bucket of the real layout, plus 2 flags per
// bucket and rank; every replayed phase grows by exactly that (the replay's buckets must be the
// store's), and the accounting lists about (N - 1) / N of the gradients.
TEST(Accounting, CopyEngineWindowForBucketedDdpIsEachBucketsPart) {
  Config c = xl_bf16();
  c.bench.batch_size = 8;
  c.parallel.device = DeviceChoice::cuda;
  c.parallel.ddp = DdpKind::bucketed;
  c.parallel.bucket_mb = 25;
  const auto nccl_mem = jobs::predict_memory_phases(c, 2, true, 0);
  c.parallel.grad_exchange = GradExchange::copy_engine;
  const auto ce_mem = jobs::predict_memory_phases(c, 2, true, 0);
  const auto ce = jobs::account(c, 2, "");
  const auto buckets = parallel::gradient_buckets(model::parameter_layout(model::ModelDims::from(c.model)),
                                               25.0 * 1024 * 1024, 4);
  double slot = 0;
  for (const auto& k : buckets) slot += std::ceil(static_cast<double>(k.numel) / 2);
  const double window = 4 * slot + 2 * 2 * static_cast<double>(buckets.size()) * 8;
  EXPECT_DOUBLE_EQ(static_cast<double>(parallel::CopyEngineAllReduce::window_bytes(buckets, 2)), window);
  const double P = 1998235200.0;
  EXPECT_GT(window, 4 * P / 2);
  EXPECT_LT(window, 4 * P / 2 + 1e5);
  EXPECT_DOUBLE_EQ(item(ce, "gradient_exchange_window"), 4 * P / 2);
  ASSERT_EQ(ce_mem.phases.size(), nccl_mem.phases.size());
  for (std::size_t i = 0; i < ce_mem.phases.size(); ++i)
    EXPECT_DOUBLE_EQ(ce_mem.phases[i].bytes - nccl_mem.phases[i].bytes, window) << ce_mem.phases[i].phase;
}

namespace {
// xl bf16 flash over pp = 2 stages, global batch 8 in 8 microbatches of one sequence, 1F1B.
Config xl_pipeline() {
  Config c = xl_bf16();
  c.bench.batch_size = 8;
  c.model.attention = AttentionImpl::flash;
  c.parallel.pp = 2;
  c.parallel.microbatches = 8;
  c.parallel.schedule = PipelineSchedule::one_f_one_b;
  return c;
}
}  // namespace

// Pipeline (pp = 2, 8 microbatches of one sequence, global batch 8): stage 0 holds the embedding
// and 24 blocks, stage 1 24 blocks, the final norm and the head; 1F1B keeps at most p - s microbatches in flight, GPipe all M; between stages each
// microbatch moves [512, 1600] bf16 once each way.
TEST(Accounting, PipelineStagesAndMicrobatchesInFlight) {
  Config c = xl_pipeline();
  const auto a = jobs::account(c, 2, "NVIDIA H100 80GB HBM3");
  const double block_params = 4.0 * 1600 * 1600 + 3.0 * 1600 * 6400 + 2 * 1600;
  const double stage0 = 10000.0 * 1600 + 24 * block_params;   // the larger stage in activations
  EXPECT_DOUBLE_EQ(item(a, "parameters"), 4 * stage0);
  const double n = 512, per_block = (8 * 1600 + 3 * 6400) * n * 2 + 2 * n * 4 + 25 * 512 * 4;
  EXPECT_DOUBLE_EQ(item(a, "activations"), 2 * 24 * per_block);   // stage 0: 2 microbatches in flight
  EXPECT_DOUBLE_EQ(a.comm_bytes_per_step, 8 * n * 1600 * 2);   // stage 0 sends activations only
  c.parallel.schedule = PipelineSchedule::gpipe;
  const auto g = jobs::account(c, 2, "NVIDIA H100 80GB HBM3");
  EXPECT_GT(item(g, "activations"), 3 * item(a, "activations"));   // all 8 in flight
}

// Pipeline with every-k checkpointing (k = 2) that keeps each block's attention output and its
// log-sum-exp: stage 0's 2 microbatches in flight keep them for all 24 of its blocks, and the one
// group being recomputed (k blocks) does not materialise them again.
TEST(Accounting, PipelineKeptAttentionIsNotRecomputed) {
  Config c = xl_pipeline();
  c.train.activation_checkpointing = Checkpointing::every_k;
  c.train.checkpoint_k = 2;
  const auto off = jobs::account(c, 2, "NVIDIA H100 80GB HBM3");
  c.train.checkpoint_keep_attention = true;
  const auto on = jobs::account(c, 2, "NVIDIA H100 80GB HBM3");
  const double kept = 512.0 * 1600 * 2 + 25 * 512 * 4;   // o [n, d] bf16 + lse [heads, n] fp32
  EXPECT_DOUBLE_EQ(item(on, "activations") - item(off, "activations"), 2 * 24 * kept - 2 * kept);
}

// fsdp pipeline stages (dp 2 x pp 2, 4 ranks, 16 rows in 8 microbatches per dp rank): stage 0's
// units (embedding and 24 blocks, norms replicated) sharded over its 2 dp ranks; per microbatch
// every unit gathered for the forward and the blocks again for the backward (bf16), every unit's
// gradients reduce-scattered (fp32); the norms all-reduced once.
TEST(Accounting, PipelineFsdpShardsEachStage) {
  Config c = xl_pipeline();
  c.bench.batch_size = 16;
  c.parallel.zero = ZeroLevel::fsdp;
  const auto a = jobs::account(c, 4, "NVIDIA H100 80GB HBM3");
  const double block = 4.0 * 1600 * 1600 + 3.0 * 1600 * 6400, norms = 24 * 2 * 1600.0;
  const double Ps = 10000.0 * 1600 + 24 * block;   // stage 0 (stage 1's head unit is as large)
  EXPECT_DOUBLE_EQ(item(a, "parameters"), 4 * (Ps / 2 + norms));
  EXPECT_DOUBLE_EQ(item(a, "gradients"), 4 * norms);
  EXPECT_DOUBLE_EQ(item(a, "gradient_shard"), 4 * Ps / 2);
  EXPECT_DOUBLE_EQ(item(a, "optimizer_state"), 8 * (Ps / 2 + norms));
  EXPECT_DOUBLE_EQ(item(a, "fsdp_gathered"), 2 * block * 1.5);   // prefetch 1 block and its cast shard
  const double n = 512, p2p = 8 * n * 1600 * 2;   // stage 0 sends activations only
  EXPECT_DOUBLE_EQ(a.comm_bytes_per_step, p2p + 8 * 0.5 * (2 * (Ps + 24 * block) + 4 * Ps) + 2 * 0.5 * 4 * norms);
  c.parallel.reshard_after_forward = false;   // gathered once per microbatch, every unit kept
  const auto k = jobs::account(c, 4, "NVIDIA H100 80GB HBM3");
  EXPECT_DOUBLE_EQ(k.comm_bytes_per_step, p2p + 8 * 0.5 * (2 * Ps + 4 * Ps) + 2 * 0.5 * 4 * norms);
  EXPECT_DOUBLE_EQ(item(k, "fsdp_gathered"), 2 * block * 1.5 + 2 * Ps);
}

// Tensor parallelism: the collectives the model makes per step, counted by hand for L = 48 layers
// (every sublayer's g forward and f backward, the embedding's g, the head's f), and each rank's
// share of parameters and activations.
TEST(Accounting, TensorParallelCommunicationAndMemory) {
  const auto m = model::ModelDims::from(xl_bf16().model);
  const double tokens = 2048, act = tokens * 1600 * 2;
  const auto plain = jobs::tensor_parallel_comm(m, tokens, 2, false, 2.0, false);
  EXPECT_EQ(plain.all_reduces, 4 * 48 + 2);
  EXPECT_DOUBLE_EQ(plain.bytes, 194 * 2 * 0.5 * act + 2 * 0.5 * tokens * 12);
  const auto sp = jobs::tensor_parallel_comm(m, tokens, 4, true, 2.0, false);
  EXPECT_EQ(sp.all_gathers, 6 * 48 + 3);
  EXPECT_EQ(sp.reduce_scatters, 4 * 48 + 2);
  EXPECT_DOUBLE_EQ(sp.bytes, (291 + 194) * 0.75 * act + 97 * 2 * 0.75 * 4 * 1600 + 2 * 0.75 * tokens * 12);
  EXPECT_EQ(jobs::tensor_parallel_comm(m, tokens, 2, false, 2.0, true).all_reduces, 6 * 48 + 2);   // recompute
  EXPECT_EQ(jobs::tensor_parallel_comm(m, tokens, 1, false, 2.0, false).bytes, 0.0);

  Config c = xl_bf16();
  c.parallel.tp = 2;
  const auto a = jobs::account(c, 2, "NVIDIA H100 80GB HBM3");
  const double norms = (2 * 48 + 1) * 1600.0, P = 1998235200;
  EXPECT_DOUBLE_EQ(item(a, "parameters"), 4.0 * ((P - norms) / 2 + norms));
  EXPECT_DOUBLE_EQ(a.tp_comm_bytes_per_step, plain.bytes);   // dp = 1: the whole batch per tp group
  const auto one = jobs::account(xl_bf16(), 1, "NVIDIA H100 80GB HBM3");
  EXPECT_LT(item(a, "activations"), item(one, "activations"));
  c.parallel.sequence_parallel = true;
  EXPECT_LT(item(jobs::account(c, 2, "NVIDIA H100 80GB HBM3"), "activations"), item(a, "activations"));
}

// 2D (fsdp over the dp axis of dp 2 x tp 2, 4 ranks): each tp rank's slices, Ps = (P - norms)/2,
// sharded over its 2 dp ranks; norms replicated; gathered units and the dp traffic are slices.
TEST(Accounting, TensorParallelFsdpShardsTheSlices) {
  Config c = xl_bf16();
  c.bench.batch_size = 8;
  c.parallel.zero = ZeroLevel::fsdp;
  const double norms = (2 * 48 + 1) * 1600.0, P = 1998235200, Ps = (P - norms) / 2;
  const auto f = jobs::account(c, 2, "NVIDIA H100 80GB HBM3");   // fsdp on 2 ranks, no tp
  c.parallel.tp = 2;
  const auto a = jobs::account(c, 4, "NVIDIA H100 80GB HBM3");
  EXPECT_DOUBLE_EQ(item(a, "parameters"), 4.0 * (Ps / 2 + norms));
  EXPECT_DOUBLE_EQ(item(a, "gradient_shard"), 4.0 * Ps / 2);
  EXPECT_DOUBLE_EQ(item(a, "gradients"), 4.0 * norms);
  EXPECT_DOUBLE_EQ(item(a, "optimizer_state"), 8.0 * (Ps / 2 + norms));
  EXPECT_DOUBLE_EQ(item(f, "optimizer_state"), 8.0 * ((P - norms) / 2 + norms));
  EXPECT_DOUBLE_EQ(item(a, "fsdp_gathered"), item(f, "fsdp_gathered") / 2);
  // all-gather twice in bf16 + reduce-scatter in fp32 of the slices over dp 2, norms all-reduced.
  EXPECT_DOUBLE_EQ(a.comm_bytes_per_step, 0.5 * (2 * 2 * Ps + 4 * Ps) + 2 * 0.5 * 4 * norms);
  EXPECT_GT(a.tp_comm_bytes_per_step, 0.0);
  EXPECT_EQ(a.local_batch, 4);
}

// parallel.fsdp_gather_dtype = fp8 (xl in fp8 under fsdp on 4 ranks): the gathered block and its
// send buffer shrink from bf16 to e4m3 (2 B -> 1 B per element), the head unit stays bf16; the
// blocks' all-gathers move 1 B per element (forward and backward), the embedding and head 2 B
// (gathered once: the head is kept, the embedding's backward reads no weights), plus one
// all-reduce of 7 fp32 amaxes before each block's gather.
TEST(Accounting, FsdpFp8GathersCountOneBytePerBlockElement) {
  Config c = xl_bf16();
  c.precision.mode = PrecisionMode::fp8;
  c.bench.batch_size = 8;
  c.parallel.zero = ZeroLevel::fsdp;
  const double block = 4.0 * 1600 * 1600 + 3.0 * 1600 * 6400, head = 10000.0 * 1600, L = 48;
  const double norms = (2 * 48 + 1) * 1600.0, P = 1998235200, Ps = P - norms, f = 0.75;
  const auto bf16 = jobs::account(c, 4, "NVIDIA H100 80GB HBM3");
  c.parallel.fsdp_gather_dtype = FsdpGatherDtype::fp8;
  const auto fp8 = jobs::account(c, 4, "NVIDIA H100 80GB HBM3");
  EXPECT_DOUBLE_EQ(item(bf16, "fsdp_gathered"), 2 * (head + block * 1.25));   // compute gathers unchanged
  EXPECT_DOUBLE_EQ(item(fp8, "fsdp_gathered"), 2 * head + block * 1.25);
  EXPECT_DOUBLE_EQ(bf16.comm_bytes_per_step, f * (2 * 2 * Ps + 4 * Ps) + 2 * f * 4 * norms);
  const double amaxes = 2 * (2 * f * 28 * L);   // forward and backward gathers of every block
  EXPECT_DOUBLE_EQ(fp8.comm_bytes_per_step, f * (2 * (Ps - L * block) + 2 * L * block + 4 * Ps) + amaxes +
                                                2 * f * 4 * norms);
  EXPECT_LT(fp8.peak_bytes, bf16.peak_bytes);
  for (const auto& i : fp8.memory)   // every other item as in the compute gathers
    if (i.name != "fsdp_gathered") EXPECT_DOUBLE_EQ(i.bytes, item(bf16, i.name)) << i.name;
  c.parallel.reshard_after_forward = false;   // every block kept (1 B), embedding and head (2 B)
  const auto kept = jobs::account(c, 4, "NVIDIA H100 80GB HBM3");
  EXPECT_DOUBLE_EQ(item(kept, "fsdp_gathered"), 2 * head + block * 1.25 + L * block + 2 * head);
  EXPECT_DOUBLE_EQ(kept.comm_bytes_per_step, f * (2 * (Ps - L * block) + L * block + 4 * Ps) + amaxes / 2 +
                                                 2 * f * 4 * norms);
}

// CS336 §8: data parallelism is communication bound once the gradient all-reduce, 2(n-1)/n x 4P
// bytes at W, takes as long as the rank's 1/n of the step's FLOPs at C: n >= 1 + F W / (8 P C).
// Tensor parallelism is bound from the degree where (n-1)/n x its activation bytes outweigh F/(nC).
TEST(Accounting, CommunicationBoundDegrees) {
  Config c = xl_bf16();
  const auto m = model::ModelDims::from(c.model);
  const double C = 989.4e12, W = 450e9, P = static_cast<double>(m.parameter_count());
  const double F = m.train_flops_per_token(512) * 4 * 512;
  const auto bounds = jobs::parallel_bounds(c, C, W);
  ASSERT_EQ(bounds.size(), 5u);
  EXPECT_EQ(bounds[0].strategy, "data");
  EXPECT_EQ(bounds[0].degree, static_cast<std::int64_t>(std::ceil(1 + F * W / (8 * P * C))));
  const auto& tp = bounds[2];
  EXPECT_EQ(tp.strategy, "tensor");
  ASSERT_GT(tp.degree, 1);
  auto tp_bound = [&](std::int64_t n) {
    return jobs::tensor_parallel_comm(m, 2048, static_cast<int>(n), false, 2.0, false).bytes / W >= F / (n * C);
  };
  EXPECT_TRUE(tp_bound(tp.degree));
  EXPECT_FALSE(tp_bound(tp.degree - 1));
  // Sequence parallelism moves more bytes here (the backward gathers the norm outputs again).
  EXPECT_LE(bounds[3].degree, tp.degree);
  // 2D reaches further than data parallelism alone (it trades gradient bytes for activation bytes).
  EXPECT_GT(bounds[4].degree, bounds[0].degree);
  // The same from the deck keys inside the accounting job.
  c.accounting.device_tflops = 989.4;
  c.accounting.link_gbps = 450;
  const auto a = jobs::account(c, 1, "");
  ASSERT_EQ(a.bounds.size(), 5u);
  EXPECT_EQ(a.bounds[2].degree, tp.degree);
}

// The planned device (issue 38): accounting.device names the planned run's device whatever this
// machine has; the accounting process then computes on the CPU, and parallel.device becomes the
// planned one (cuda for a GPU, so a bf16 deck is a GPU plan, not a refused CPU run). The table's
// memory is what CUDA reports on those parts. auto on a cuda deck: the visible GPU if there is
// one, else an H100 80GB.
TEST(Accounting, PlannedDeviceIsTheDecksNotThisMachines) {
  Config c = xl_bf16();
  c.run.job = JobKind::accounting;
  c.parallel.device = DeviceChoice::cpu;
  c.accounting.device = TargetDevice::h200;
  const Config h200 = jobs::resolve_runtime(c, 1);
  EXPECT_EQ(h200.parallel.device, DeviceChoice::cuda);
  EXPECT_EQ(h200.parallel.backend, BackendChoice::nccl);
  EXPECT_EQ(h200.accounting.device, TargetDevice::h200);
  EXPECT_EQ(jobs::process_device(h200), Device::cpu);
  const jobs::PlannedDevice d = jobs::named_planned_device(TargetDevice::h200);
  EXPECT_EQ(d.name, "NVIDIA H200");
  EXPECT_TRUE(d.cuda);
  EXPECT_DOUBLE_EQ(d.memory_bytes, 143771.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(jobs::named_planned_device(TargetDevice::h100_80gb).memory_bytes, 81559.0 * 1024 * 1024);
  EXPECT_FALSE(jobs::named_planned_device(TargetDevice::cpu).cuda);

  c.accounting.device = TargetDevice::automatic;   // a CPU deck plans a CPU run
  const Config cpu = jobs::resolve_runtime(c, 1);
  EXPECT_EQ(cpu.accounting.device, TargetDevice::cpu);
  EXPECT_EQ(cpu.parallel.device, DeviceChoice::cpu);
  EXPECT_EQ(jobs::process_device(cpu), Device::cpu);

  c.parallel.device = DeviceChoice::cuda;   // a GPU deck: never refused for this machine's lack of one
  const Config gpu = jobs::resolve_runtime(c, 1);
  EXPECT_EQ(gpu.parallel.device, DeviceChoice::cuda);
  if (gpu.accounting.device == TargetDevice::automatic) {
    EXPECT_EQ(jobs::process_device(gpu), Device::cuda);   // a GPU is visible: its properties
  } else {
    EXPECT_EQ(gpu.accounting.device, TargetDevice::h100_80gb);
    EXPECT_EQ(jobs::process_device(gpu), Device::cpu);
    c.run.job = JobKind::train;   // a run, not a plan, still needs the GPU it asks for
    EXPECT_THROW(jobs::resolve_runtime(c, 1), UsageError);
  }
}

// The moe-1b preset (8 experts, top-2, d 1024, 12 layers, expert d_ff 2816, vocab 10000), batch
// 8 x 1024 per rank on ep = dp = 2: parameters counted by hand.
TEST(AccountingMoe, Moe1bPresetByHand) {
  Config c;
  c.run.job = JobKind::train;
  c.model.vocab_size = 10000;
  c.model.d_model = 1024;
  c.model.d_ff = 2816;
  c.model.num_layers = 12;
  c.model.num_heads = 16;
  c.model.context_length = 1024;
  c.model.moe_experts = 8;
  c.model.moe_top_k = 2;
  c.model.moe_expert_dff = 2816;
  c.parallel.ep = 2;
  c.parallel.dp = 2;
  c.train.batch_size = 16;
  const jobs::MoeAccounting a = jobs::account_moe(c, 2);
  const std::int64_t d = 1024, V = 10000, L = 12, E = 8, Fe = 2816;
  const std::int64_t experts = L * E * 3 * d * Fe;
  EXPECT_EQ(a.expert_parameters, experts);
  EXPECT_EQ(a.total_parameters, 2 * V * d + L * (4 * d * d + 2 * d + E * d) + experts + d);
  EXPECT_EQ(a.total_parameters - a.active_parameters, L * (E - 2) * 3 * d * Fe);
  EXPECT_DOUBLE_EQ(a.expert_state_bytes_per_rank, 16.0 * static_cast<double>(experts) / 2);
  // 4 all-to-alls x 12 blocks x (8 x 1024 tokens x 2) rows x 1/2 remote x 1024 x 4 bytes.
  EXPECT_DOUBLE_EQ(a.all_to_all_bytes_per_step, 4.0 * 12 * 16384 * 0.5 * 1024 * 4);
  c.train.activation_checkpointing = Checkpointing::every_k;   // the recompute's two more
  EXPECT_DOUBLE_EQ(jobs::account_moe(c, 2).all_to_all_bytes_per_step, 6.0 * 12 * 16384 * 0.5 * 1024 * 4);
}

// The accounting job describes fsdp for an MoE model (the train job refuses it): its units hold
// each block's router and experts, so the replay's fsdp state is the whole model's non-norm
// parameters in 1/dp shards. (The replay once numbered the parameters as a dense model's: the
// head's index fell past the MoE list, and 2 ranks with grad_accum 2 crashed the job.)
TEST(AccountingMoe, FsdpReplayShardsEveryParameter) {
  Config c;
  c.run.job = JobKind::accounting;
  c.model.vocab_size = 96;
  c.model.d_model = 32;
  c.model.d_ff = 64;
  c.model.num_layers = 2;
  c.model.num_heads = 4;
  c.model.context_length = 16;
  c.model.moe_experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_expert_dff = 24;
  c.parallel.dp = 2;
  c.parallel.zero = ZeroLevel::fsdp;
  c.parallel.device = DeviceChoice::cpu;
  c.train.batch_size = 8;
  for (std::int64_t accum : {1, 2}) {
    c.train.grad_accum = accum;
    const auto phases = jobs::predict_memory_phases(c, 2, false, 0);
    const double d = 32, V = 96, L = 2, E = 4, Fe = 24;
    const double norms = (2 * L + 1) * d, matrices = 2 * V * d + L * (4 * d * d + E * d + E * 3 * d * Fe);
    const double S = matrices / 2;   // every unit splits evenly over the 2 ranks
    // fp32 master and gradient shard, replicated norms and their gradients, AdamW m and v.
    ASSERT_FALSE(phases.phases.empty());
    EXPECT_DOUBLE_EQ(phases.phases.front().bytes, 4 * S * 2 + 4 * norms * 2 + 4 * (S + norms) * 2) << "accum " << accum;
    EXPECT_LT(phases.peak, 16.0 * (1 << 20)) << "accum " << accum;
  }
}

// The expert row of the communication-bound table (docs/parallel.md): per token both sides scale
// as 1/n, so ep = n is bound from the smallest n dividing E with
// (n-1)/n >= F_token W / (a L_moe k d e C), a = 4 all-to-alls per MoE block (6 with every-k).
TEST(AccountingMoe, ExpertParallelBoundByHand) {
  Config c;
  c.run.job = JobKind::train;
  c.model.vocab_size = 10000;
  c.model.d_model = 1024;
  c.model.d_ff = 2816;
  c.model.num_layers = 12;
  c.model.num_heads = 16;
  c.model.context_length = 1024;
  c.model.moe_experts = 8;
  c.model.moe_top_k = 2;
  c.model.moe_expert_dff = 2816;
  c.train.batch_size = 16;
  const auto m = model::ModelDims::from(c.model);
  const double F_token = m.train_flops_per_token(1024);
  auto expected = [&](double C, double W, double a) {
    const double r = F_token * W / (a * 12 * 2 * 1024 * 4.0 * C);
    for (std::int64_t n : {2, 4, 8})
      if (static_cast<double>(n - 1) / static_cast<double>(n) >= r) return n;
    return std::int64_t{0};
  };
  auto expert_row = [](const std::vector<jobs::ParallelBound>& b) {
    for (const auto& x : b)
      if (x.strategy == "expert") return x;
    ADD_FAILURE() << "no expert row";
    return jobs::ParallelBound{};
  };
  // A slow link: bound at 2. A link fast enough that (n-1)/n must exceed 0.6: bound at 4 (3 does not
  // divide 8). Faster than the per-token ratio allows at any n <= 8: none (0).
  const double C = 100e12;
  const double W2 = 0.4 * 4 * 12 * 2 * 1024 * 4.0 * C / F_token, W4 = 0.6 * 4 * 12 * 2 * 1024 * 4.0 * C / F_token;
  const double Wnone = 0.9 * 4 * 12 * 2 * 1024 * 4.0 * C / F_token;
  EXPECT_EQ(expert_row(jobs::parallel_bounds(c, C, W2)).degree, 2);
  EXPECT_EQ(expert_row(jobs::parallel_bounds(c, C, W4)).degree, expected(C, W4, 4));
  EXPECT_EQ(expected(C, W4, 4), 4);
  EXPECT_EQ(expert_row(jobs::parallel_bounds(c, C, Wnone)).degree, 0);
  EXPECT_EQ(expert_row(jobs::parallel_bounds(c, C, Wnone)).limit, 8);
  // every-k: 6 all-to-alls per block instead of 4, so the same link binds earlier.
  c.train.activation_checkpointing = Checkpointing::every_k;
  EXPECT_EQ(expert_row(jobs::parallel_bounds(c, C, Wnone)).degree, expected(C, Wnone, 6));
  EXPECT_EQ(expected(C, Wnone, 6), 4);
  // Dense models have no expert row.
  c.model.moe_experts = 0;
  for (const auto& x : jobs::parallel_bounds(c, C, W2)) EXPECT_NE(x.strategy, "expert");
}
