// parallel.ep_exchange = copy-engine on 2 GPUs (label gpu, mpirun -np 2; part of
// mpi_test_parallel_gpu): expert parallelism's row all-to-all over the copy engines
// (parallel/copy_engine_all_to_all.h) moves the same bits as NCCL's all_to_all_v, call for call
// (uneven counts, zero rows, rows over several chunks of the window, an empty call), and an MoE
// model trained with ep = 2 over it reaches the same losses and parameters, bit for bit, as over
// NCCL. Skipped (77) without 2 GPUs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "lmscale/comm/factory.h"
#include "lmscale/io/dataset.h"
#include "lmscale/io/deck.h"
#include "lmscale/jobs/engine/trainer.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/ops/ops.h"
#include "lmscale/parallel/copy_engine_all_to_all.h"
#include "gpu_tiny_config.h"
#include "mpi_test_support.h"

using namespace lmscale;

namespace {

bool two_gpus() {
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  return gpus >= 2 && test::mpi_env().size() == 2;
}

std::size_t tracked(ops::Runtime& rt, const char* tag) {
  const auto& tags = rt.allocator().tracker().by_tag();
  const auto it = tags.find(tag);
  return it == tags.end() ? 0 : it->second;
}

// The bits of rank r's send row i, column c, in call k: distinct for every (r, k, i, c) used here.
std::uint16_t pattern(int r, int k, std::int64_t i, std::int64_t c, std::int64_t width) {
  return static_cast<std::uint16_t>((r << 14) | (k << 10) | (i * width + c));
}

std::vector<std::uint16_t> to_host(ops::Runtime& rt, const Tensor& t) {
  std::vector<std::uint16_t> h(static_cast<std::size_t>(t.numel()));
  Tensor view = Tensor::view(h.data(), t.shape(), DType::bf16, Device::cpu);
  if (t.numel() > 0) ops::copy(rt.ctx(), t, view);
  rt.synchronize();
  return h;
}

}  // namespace

// The all-to-all itself against NCCL's all_to_all_v and against the rows each rank sent, on a
// window of 3 rows of width 5 (bf16): a pair's 7 or 9 rows go as 3 chunks, each waiting for the
// receiver to have read the last; one rank sends its peer nothing, or nothing at all; a call
// moves no rows. The calls are queued back to back with no host wait between them (the slots are
// reused as soon as the signals allow), then compared.
TEST(ExpertParallelGpu, CopyEngineAllToAllEqualsNcclBitwise) {
  if (!two_gpus()) GTEST_SKIP() << "needs 2 ranks on 2 GPUs";
  auto& mpi = test::mpi_env();
  const int me = mpi.rank();
  ops::Runtime rt(Device::cuda, mpi.local_rank(), false);
  auto nccl = comm::make_world_communicator(comm::Backend::nccl, mpi, mpi.local_rank(), false, 0);
  auto host = comm::make_world_communicator(comm::Backend::mpi, mpi, mpi.local_rank());
  nccl->set_compute_stream(rt.ctx().stream);
  const std::int64_t W = 5;
  const std::size_t slot = 3 * W * sizeof(std::uint16_t);
  // rows[k][from][to]: the rows rank `from` sends rank `to` in call k.
  using Counts = std::array<std::array<std::int64_t, 2>, 2>;
  const std::vector<Counts> calls{
      Counts{{{4, 2}, {3, 3}}},    // one chunk each way
      Counts{{{1, 0}, {7, 2}}},    // 0 sends 1 nothing; 1 sends 0 seven rows: 3 chunks
      Counts{{{0, 9}, {0, 0}}},    // 1 sends nothing at all; 0 sends 1 nine rows: 3 full chunks
      Counts{{{0, 0}, {0, 0}}},    // no rows anywhere
      Counts{{{2, 3}, {3, 2}}},    // the slots again, right after
      Counts{{{5, 8}, {11, 1}}},   // 3 chunks one way, 1 the other
  };
  struct Call {
    Tensor send, ce, nccl;
    std::vector<std::int64_t> send_rows, recv_rows;
  };
  std::vector<Call> done;
  {
    parallel::CopyEngineAllToAll exchange(*host, slot, rt);
    EXPECT_EQ(tracked(rt, parallel::CopyEngineAllToAll::kTag), parallel::CopyEngineAllToAll::window_bytes(2, slot));
    // The inputs first; then the calls, queued back to back.
    for (std::size_t k = 0; k < calls.size(); ++k) {
      Call c;
      c.send_rows = {calls[k][me][0], calls[k][me][1]};
      c.recv_rows = {calls[k][0][me], calls[k][1][me]};
      const std::int64_t ns = c.send_rows[0] + c.send_rows[1], nr = c.recv_rows[0] + c.recv_rows[1];
      std::vector<std::uint16_t> h(static_cast<std::size_t>(ns * W));
      for (std::int64_t i = 0; i < ns; ++i)
        for (std::int64_t col = 0; col < W; ++col)
          h[static_cast<std::size_t>(i * W + col)] = pattern(me, static_cast<int>(k), i, col, W);
      c.send = Tensor::empty({ns, W}, DType::bf16, rt.allocator(), "test");
      if (ns > 0) {
        Tensor hv = Tensor::view(h.data(), {ns, W}, DType::bf16, Device::cpu);
        ops::copy(rt.ctx(), hv, c.send);
      }
      c.ce = Tensor::empty({nr, W}, DType::bf16, rt.allocator(), "test");
      c.nccl = Tensor::empty({nr, W}, DType::bf16, rt.allocator(), "test");
      if (nr > 0) {
        ops::fill(rt.ctx(), c.ce, 1.0);   // a row left unwritten shows
        ops::fill(rt.ctx(), c.nccl, 2.0);
      }
      rt.synchronize();   // h goes out of scope
      done.push_back(std::move(c));
    }
    for (Call& c : done) exchange.rows(c.send, c.send_rows, c.ce, c.recv_rows);
  }   // the exchange waits for the peers' last reads, frees its window
  EXPECT_EQ(tracked(rt, parallel::CopyEngineAllToAll::kTag), 0u);
  for (std::size_t k = 0; k < done.size(); ++k) {
    Call& c = done[k];
    std::vector<std::size_t> sc, rc;
    for (std::int64_t n : c.send_rows) sc.push_back(static_cast<std::size_t>(n * W));
    for (std::int64_t n : c.recv_rows) rc.push_back(static_cast<std::size_t>(n * W));
    nccl->all_to_all_v(c.send, sc, c.nccl, rc).wait();
    const auto ce = to_host(rt, c.ce), ref = to_host(rt, c.nccl);
    EXPECT_EQ(ce, ref) << "call " << k << " on rank " << me;
    // And the rows each sender sent: rank j's rows for this rank start after its rows for lower ranks.
    std::vector<std::uint16_t> want;
    for (int j = 0; j < 2; ++j) {
      const std::int64_t first = me == 0 ? 0 : calls[k][j][0];
      for (std::int64_t i = first; i < first + calls[k][j][me]; ++i)
        for (std::int64_t col = 0; col < W; ++col) want.push_back(pattern(j, static_cast<int>(k), i, col, W));
    }
    EXPECT_EQ(ce, want) << "call " << k << " on rank " << me;
  }
}

namespace {

struct MoeRun {
  std::vector<double> losses;
  double eval_before = 0, eval_loss = 0;   // evaluations before the first step and after the last
  std::vector<float> params;
  std::size_t window = 0;
  // Per MoE block of the first step: the experts this rank's tokens chose (routed > 0).
  std::vector<int> first_step_experts_used;
};

// A tiny MoE model (4 experts in both blocks) in bf16, ep = 2 over 2 GPUs (dp = ep: one expert_dp
// rank). zero_router: the routers start at 0, so every token has equal logits and all choose the
// same top_k experts in the first step.
MoeRun train_moe(const Config& cfg, int steps, bool zero_router) {
  auto& mpi = test::mpi_env();
  ops::Runtime rt(Device::cuda, mpi.local_rank(), false);
  io::ResultsFile out("/nonexistent/never-written.h5", false);
  jobs::JobEnv env{cfg, mpi, rt, out, mpi.rank(), mpi.size(), mpi.local_rank(), nullptr, nullptr};
  env.comm = comm::make_world_communicator(comm::Backend::nccl, mpi, mpi.local_rank(), false, 0);
  env.host_comm = comm::make_world_communicator(comm::Backend::mpi, mpi, mpi.local_rank());
  const std::int64_t B = 8, T = cfg.model.context_length;
  jobs::Trainer trainer(env, B, cfg.train.grad_accum, steps);
  MoeRun run;
  run.window = tracked(rt, parallel::CopyEngineAllToAll::kTag);
  if (zero_router) {
    std::vector<float> full = trainer.full_parameters();
    for (const auto& p : model::parameter_layout(model::ModelDims::from(cfg.model)))
      if (p.name.find("router") != std::string::npos)
        std::fill(full.begin() + p.offset, full.begin() + p.offset + p.numel, 0.0f);
    trainer.set_parameters(full);
  }
  io::SyntheticTokens data(cfg.model.vocab_size, cfg.run.seed);
  std::vector<std::int32_t> tok(static_cast<std::size_t>(trainer.local_rows() * (T + 1)));
  // An evaluation: the whole local batch in one forward (grad_accum micro-batches' rows at once).
  data.sample(0, trainer.first_row(), trainer.local_rows(), T, tok.data(), true);
  run.eval_before = trainer.forward_loss(tok, T);
  for (int s = 0; s < steps; ++s) {
    data.sample(static_cast<std::uint64_t>(s), trainer.first_row(), trainer.local_rows(), T, tok.data(), false);
    trainer.model().reset_moe_stats();
    run.losses.push_back(trainer.train_step(tok, T).loss);
    if (s == 0)
      for (const auto& st : trainer.model().moe_stats(rt.ctx()))
        run.first_step_experts_used.push_back(
            static_cast<int>(std::count_if(st.routed.begin(), st.routed.end(), [](std::int64_t n) { return n > 0; })));
  }
  data.sample(0, trainer.first_row(), trainer.local_rows(), T, tok.data(), true);
  run.eval_loss = trainer.forward_loss(tok, T);
  run.params = trainer.full_parameters();
  rt.synchronize();
  return run;
}

}  // namespace

// ep = 2 over the copy engines against ep = 2 over NCCL: the rows are copied, not computed, so
// every loss, the evaluation and every parameter are the same bits. Cases: dropless top-2; with
// capacity drops, 2 micro-batches and every-k checkpointing (the recomputed forward's
// all-to-alls run inside the backward); and routers started at 0 with top-1 and 2 micro-batches,
// so that before the first update every token of both ranks picks the same expert: the rank
// without it receives no rows and sends its peer all of its own (a full slot in the first step; in
// the evaluation before it, the whole local batch, twice the window's micro-batch: 2 chunks), and
// its peer sends it none. The window is the predicted size (the memory model's).
TEST(ExpertParallelGpu, CopyEngineExchangeEqualsNcclBitwise) {
  if (!two_gpus()) GTEST_SKIP() << "needs 2 ranks on 2 GPUs";
  struct Case {
    const char* name;
    double capacity;
    int top_k, accum;
    Checkpointing ac;
    bool zero_router;
  };
  for (const Case k : {Case{"dropless", 0.0, 2, 1, Checkpointing::none, false},
                       Case{"capacity, 2 micro-batches, every-k", 1.0, 2, 2, Checkpointing::every_k, false},
                       Case{"routers at 0, top-1, 2 micro-batches", 0.0, 1, 2, Checkpointing::none, true}}) {
    Config cfg = test::gpu_tiny_config();   // its bucket size plays no part: ep = dp, expert_dp = 1
    cfg.model.moe_experts = 4;
    cfg.model.moe_expert_dff = 48;
    cfg.model.moe_top_k = k.top_k;
    cfg.model.moe_capacity_factor = k.capacity;
    cfg.parallel.ep = 2;
    cfg.train.grad_accum = k.accum;
    cfg.train.activation_checkpointing = k.ac;
    const int steps = 4;
    const MoeRun nccl = train_moe(cfg, steps, k.zero_router);
    cfg.parallel.ep_exchange = EpExchange::copy_engine;
    const MoeRun ce = train_moe(cfg, steps, k.zero_router);
    std::printf("ep 2, %s: window %zu bytes, last loss nccl %.6f copy engines %.6f, eval %.6f %.6f\n", k.name,
                ce.window, nccl.losses.back(), ce.losses.back(), nccl.eval_loss, ce.eval_loss);
    std::fflush(stdout);
    EXPECT_EQ(nccl.window, 0u) << k.name;
    // 8 sequences over 2 ranks in `accum` micro-batches of 32 tokens, top-k, d 64, bf16.
    const std::size_t slot = parallel::CopyEngineAllToAll::slot_bytes(model::ModelDims::from(cfg.model), 4 / k.accum, 2);
    EXPECT_EQ(ce.window, parallel::CopyEngineAllToAll::window_bytes(2, slot)) << k.name;
    EXPECT_EQ(ce.losses, nccl.losses) << k.name;
    EXPECT_EQ(std::memcmp(&ce.eval_before, &nccl.eval_before, sizeof(double)), 0) << k.name;
    EXPECT_EQ(std::memcmp(&ce.eval_loss, &nccl.eval_loss, sizeof(double)), 0) << k.name;
    ASSERT_EQ(ce.params.size(), nccl.params.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < ce.params.size(); ++i) differ += std::memcmp(&ce.params[i], &nccl.params[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << k.name << ": parameters that differ from ep over NCCL";
    if (k.zero_router) {
      // Every MoE block's tokens all chose one expert (of the 2 ranks' 4): uneven routing happened.
      ASSERT_EQ(ce.first_step_experts_used.size(), 2u);
      for (int used : ce.first_step_experts_used) EXPECT_EQ(used, 1) << k.name;
    }
  }
}
