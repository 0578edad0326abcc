// The vocabulary-parallel CUDA ops (ops/vocab_parallel.h) against the float64 CPU reference, in
// fp32, bf16 and fp16, on a shard in the middle of the vocabulary (vocab_begin > 0) with targets
// inside and outside the shard, vectorised and not (Vl a multiple of 8 or not), in place and not.
// The statistics between the steps are the reference's (as after the all-reduce), so each step is
// checked on its own. Bounds: ops_cuda_test_util.h.
#include <cuda_runtime.h>

#include "lmscale/ops/vocab_parallel.h"
#include "ops_cuda_test_util.h"

namespace lmscale::test {
namespace {

const DType kTypes[] = {DType::f32, DType::bf16, DType::f16};

TEST_F(CudaOpsTest, VocabParallelCrossEntropySteps) {
  struct Case {
    std::int64_t N, Vl, begin;
  };
  for (DType t : kTypes)
    for (const auto& [N, Vl, begin] : {Case{64, 5000, 5000}, Case{33, 501, 1002}, Case{5, 3, 3}})
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " N=" << N << " Vl=" << Vl << " begin=" << begin
                                          << (in_place ? " in place" : ""));
        const auto logits = randn(N * Vl, t, 3.0);
        // Targets over the whole vocabulary [0, 3 Vl): about a third fall in this shard.
        const auto targets = randint(N, 0, static_cast<std::int32_t>(3 * Vl));
        Tensor lr = ref(logits, {N, Vl});
        Tensor mr = ref(std::vector<double>(N), {N});
        ops::vocab_parallel_max(c(), lr, mr);
        Tensor m = poisoned({N}, DType::f32);
        ops::vocab_parallel_max(g(), dev(logits, {N, Vl}, t), m);
        EXPECT_CLOSE(values(m), values(mr), 1e-6);
        // Statistics as they are after the all-reduce: the reference's row max plus a shift, as if
        // another rank held a larger logit.
        std::vector<double> M = values(mr);
        for (auto& x : M) x = round_to(x + 0.5, DType::f32);
        Tensor sr = ref(std::vector<double>(2 * N), {N, 2});
        ops::vocab_parallel_sums(c(), lr, host_ids(targets, {N}), begin, ref(M, {N}), sr);
        Tensor s = poisoned({N, 2}, DType::f32);
        ops::vocab_parallel_sums(g(), dev(logits, {N, Vl}, t), dev_ids(targets, {N}), begin, dev(M, {N}, DType::f32), s);
        EXPECT_CLOSE(values(s), values(sr), 1e-5);
        // The summed exponentials of the other ranks: add a positive amount to S.
        std::vector<double> S = values(sr);
        for (std::int64_t n = 0; n < N; ++n) S[static_cast<std::size_t>(2 * n)] = round_to(S[static_cast<std::size_t>(2 * n)] + 1.25, DType::f32);
        const double scale = 1024.0 / static_cast<double>(N);
        Tensor lossr = ref({0.0}, {1}), dlr = ref(std::vector<double>(N * Vl), {N, Vl});
        ops::vocab_parallel_loss(c(), lr, host_ids(targets, {N}), begin, ref(M, {N}), ref(S, {N, 2}), lossr, &dlr, scale);
        Tensor ld = dev(logits, {N, Vl}, t);
        Tensor dl = in_place ? ld : poisoned({N, Vl}, t);
        Tensor loss = poisoned({1}, DType::f32);
        ops::vocab_parallel_loss(g(), ld, dev_ids(targets, {N}), begin, dev(M, {N}, DType::f32),
                                 dev(S, {N, 2}, DType::f32), loss, &dl, scale);
        EXPECT_CLOSE(values(loss), values(lossr), 1e-5);
        EXPECT_CLOSE(values(dl), values(dlr), tolerance(t));
      }
}

TEST_F(CudaOpsTest, EmbeddingShardForwardBackward) {
  struct Case {
    std::int64_t Vl, d, N, begin;
  };
  for (DType t : kTypes)
    for (DType grad_t : {t, DType::f32})
      for (const auto& [Vl, d, N, begin] : {Case{500, 64, 512, 500}, Case{7, 13, 300, 14}, Case{50, 1600, 64, 0}}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " grad " << dtype_name(grad_t) << " Vl=" << Vl
                                          << " d=" << d << " N=" << N << " begin=" << begin);
        const auto table = randn(Vl * d, t), dout = randn(N * d, t), dt0 = randn(Vl * d, grad_t);
        const auto ids = randint(N, 0, static_cast<std::int32_t>(begin + 2 * Vl));   // some outside the shard
        Tensor out = poisoned({N, d}, t);
        ops::embedding_shard(g(), dev_ids(ids, {N}), dev(table, {Vl, d}, t), begin, out);
        Tensor outr = ref(std::vector<double>(N * d), {N, d});
        ops::embedding_shard(c(), host_ids(ids, {N}), ref(table, {Vl, d}), begin, outr);
        EXPECT_CLOSE(values(out), values(outr), tolerance(t));
        Tensor dt = dev(dt0, {Vl, d}, grad_t);
        ops::embedding_shard_backward(g(), dev_ids(ids, {N}), dev(dout, {N, d}, t), begin, dt);
        Tensor dtr = ref(dt0, {Vl, d});
        ops::embedding_shard_backward(c(), host_ids(ids, {N}), ref(dout, {N, d}), begin, dtr);
        EXPECT_CLOSE(values(dt), values(dtr), tolerance(grad_t));
      }
}

}  // namespace
}  // namespace lmscale::test
