// Cross-entropy on the CPU, per row of V logits x with target t:
//   m = max_j x_j,  lse = m + log(sum_j exp(x_j - m))   (max-subtracted: no overflow)
//   loss_sum = sum over rows of (lse - x_t)             (accumulated in double)
//   dlogits_j = (exp(x_j - lse) - [j == t]) * grad_scale
// A row is fully read (its max, its sum, x_t) before its gradient is written, so dlogits may be
// the logits' own memory.
#include <cmath>

#include "cpu_ops.h"
#include "dtype_dispatch.h"

namespace lmscale::ops::cpu {

void cross_entropy(Context&, const Tensor& logits, const Tensor& targets, Tensor& loss_sum, Tensor* dlogits,
                   double grad_scale) {
  constexpr const char* op = "ops::cross_entropy";
  const std::int64_t V = logits.dim(-1), rows = targets.numel();
  const std::int32_t* tgt = targets.data_as<std::int32_t>();
  for (std::int64_t n = 0; n < rows; ++n) {
    LMSCALE_CHECK(tgt[n] >= 0 && tgt[n] < V, "{}: targets[{}] = {} is outside the vocabulary [0, {})", op, n, tgt[n],
                  V);
  }
  dispatch_real(op, logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    double total = 0;
    for (std::int64_t n = 0; n < rows; ++n) {
      const T* x = logits.data_as<T>() + n * V;
      T m = x[0];
      for (std::int64_t j = 1; j < V; ++j) m = x[j] > m ? x[j] : m;
      double sum = 0;
      for (std::int64_t j = 0; j < V; ++j) sum += static_cast<double>(std::exp(x[j] - m));
      const double lse = static_cast<double>(m) + std::log(sum);
      const T x_target = x[tgt[n]];
      total += lse - static_cast<double>(x_target);
      if (dlogits) {
        T* d = dlogits->data_as<T>() + n * V;
        const T lse_t = static_cast<T>(lse), gs = static_cast<T>(grad_scale);
        for (std::int64_t j = 0; j < V; ++j) d[j] = std::exp(x[j] - lse_t) * gs;
        d[tgt[n]] -= gs;
      }
    }
    loss_sum.data_as<T>()[0] = static_cast<T>(total);
  });
}

}  // namespace lmscale::ops::cpu
