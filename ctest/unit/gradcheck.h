#pragma once
// Central-difference gradient check in float64, for op tests and the whole-model check.
//
// Given a scalar function f that reads the current contents of some fp64 host tensors, and the
// analytic gradients df/dx of each, it perturbs element i of x by +-h in place, takes
//   numeric_i = (f(x + h e_i) - f(x - h e_i)) / ((x_i + h) - (x_i - h))
// (the step actually taken after rounding), restores x_i bit for bit, and requires
//   |analytic_i - numeric_i| <= rtol * max(|analytic_i|, |numeric_i|) + atol.
// atol covers the rounding noise of the difference quotient, about eps * |f| / h: with the
// default h = 1e-6 a gradient much smaller than ~1e-3 |f| cannot be checked to 1e-6 relative. By
// default atol = 32 * DBL_EPSILON * max(|f(x)|, 1) / h (7e-9 * max(|f|, 1) for h = 1e-6); set it
// to anything >= 0 to override. For big tensors, max_elements picks a deterministic random subset
// (always including the first and last element).
//
// Use:
//   auto r = lmscale::test::gradcheck(f, {{"x", &x, &dx}, {"w", &w, &dw}});
//   EXPECT_TRUE(r.ok) << r.report();
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lmscale/core/error.h"
#include "lmscale/core/rng.h"
#include "lmscale/core/tensor.h"

namespace lmscale::test {

struct GradCheckInput {
  std::string name;
  Tensor* value = nullptr;        // fp64 host tensor read by f; perturbed in place, then restored
  const Tensor* grad = nullptr;   // analytic df/dvalue, fp64 host, same element count
};

struct GradCheckOptions {
  double h = 1e-6;                 // finite-difference step
  double rtol = 1e-6;              // relative error bound
  double atol = -1;                // absolute slack; < 0 means automatic (see above)
  std::int64_t max_elements = 0;   // per input: 0 = every element, else a random subset of this size
  std::uint64_t seed = 12345;      // for the subset
  int max_reported = 8;            // failures listed in the report
};

struct GradCheckResult {
  bool ok = true;
  std::int64_t checked = 0;
  std::int64_t failed = 0;
  double max_error = 0;   // max of |a - n| / (rtol * max(|a|, |n|) + atol): <= 1 passes
  double atol = 0;        // the absolute slack used
  double f0 = 0;          // f at the unperturbed point
  std::string worst;      // the element with the largest error
  std::string failures;   // the first few failures, one a line
  // One line: checked, failed, max error relative to the bound.
  std::string summary() const {
    return fmt::format("gradcheck: {} checked, {} failed, max error {:.3g} of the bound (rtol-relative), worst {}",
                       checked, failed, max_error, worst);
  }
  std::string report() const {
    return fmt::format("gradcheck: {} elements checked, {} failed; max error {:.3g} of the bound (f = {:.6g}, atol = "
                       "{:.3g})\nworst: {}\n{}",
                       checked, failed, max_error, f0, atol, worst, failures);
  }
};

namespace detail {

// Indices of the elements to check: all, or a sorted deterministic subset including both ends.
inline std::vector<std::int64_t> gradcheck_indices(std::int64_t n, const std::string& name,
                                                   const GradCheckOptions& opt) {
  std::vector<std::int64_t> idx;
  if (opt.max_elements <= 0 || n <= opt.max_elements) {
    idx.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) idx[static_cast<std::size_t>(i)] = i;
    return idx;
  }
  const CounterRng rng(opt.seed, hash_name(name));
  idx.push_back(0);
  idx.push_back(n - 1);
  for (std::uint64_t k = 0; static_cast<std::int64_t>(idx.size()) < opt.max_elements; ++k) {
    idx.push_back(static_cast<std::int64_t>(rng.below(k, static_cast<std::uint64_t>(n))));
    if (k > static_cast<std::uint64_t>(16 * opt.max_elements)) break;   // guard; n > max_elements so rarely hit
  }
  std::sort(idx.begin(), idx.end());
  idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  return idx;
}

}  // namespace detail

inline GradCheckResult gradcheck(const std::function<double()>& f, const std::vector<GradCheckInput>& inputs,
                                 const GradCheckOptions& opt = {}) {
  GradCheckResult r;
  for (const auto& in : inputs) {
    LMSCALE_CHECK(in.value && in.grad, "gradcheck: input '{}' needs a value and a gradient", in.name);
    LMSCALE_CHECK(in.value->dtype() == DType::f64 && in.grad->dtype() == DType::f64 &&
                      in.value->device() == Device::cpu && in.grad->device() == Device::cpu,
                  "gradcheck: '{}' and its gradient must be fp64 host tensors", in.name);
    LMSCALE_CHECK(in.value->numel() == in.grad->numel(), "gradcheck: '{}' has {} elements but its gradient {}",
                  in.name, in.value->numel(), in.grad->numel());
  }
  r.f0 = f();
  r.atol = opt.atol >= 0 ? opt.atol : 32.0 * DBL_EPSILON * std::max(std::fabs(r.f0), 1.0) / opt.h;
  double worst_err = -1;
  for (const auto& in : inputs) {
    double* x = in.value->data_as<double>();
    const double* g = in.grad->data_as<double>();
    for (std::int64_t i : detail::gradcheck_indices(in.value->numel(), in.name, opt)) {
      const double saved = x[i];
      const double xp = saved + opt.h, xm = saved - opt.h;
      x[i] = xp;
      const double fp = f();
      x[i] = xm;
      const double fm = f();
      x[i] = saved;
      const double numeric = (fp - fm) / (xp - xm);
      const double analytic = g[i];
      const double bound = opt.rtol * std::max(std::fabs(analytic), std::fabs(numeric)) + r.atol;
      const double diff = std::fabs(analytic - numeric);
      // NaN anywhere fails (the comparison below is false for NaN).
      const double err = bound > 0 ? diff / bound : (diff == 0 ? 0.0 : INFINITY);
      const bool pass = diff <= bound;
      ++r.checked;
      const std::string where = fmt::format("{}[{}]: analytic {:.12g}, numeric {:.12g}, |diff| {:.3g}, bound {:.3g}",
                                            in.name, i, analytic, numeric, diff, bound);
      if (!pass) {
        ++r.failed;
        r.ok = false;
        if (r.failed <= opt.max_reported) r.failures += where + "\n";
      }
      if (!(err <= worst_err)) {   // also takes NaN
        worst_err = std::isnan(err) ? INFINITY : err;
        r.worst = where;
      }
    }
  }
  r.max_error = std::max(worst_err, 0.0);
  return r;
}

}  // namespace lmscale::test
