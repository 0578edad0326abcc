#include "lmscale/jobs/magnitude_pruning.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "lmscale/core/error.h"

namespace lmscale::jobs {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_prunable(const model::ParamInfo& p) {
  if (p.layer < 0 || p.kind != model::ParamInfo::Kind::linear) return false;
  return ends_with(p.name, "_proj.weight") || ends_with(p.name, "ffn.w1.weight") ||
         ends_with(p.name, "ffn.w2.weight") || ends_with(p.name, "ffn.w3.weight");
}

// w1, w2, w3 of block `layer` in the full layout.
struct FfnParams {
  const model::ParamInfo *w1 = nullptr, *w2 = nullptr, *w3 = nullptr;
};
std::vector<FfnParams> ffn_params(const std::vector<model::ParamInfo>& layout, std::int64_t layers) {
  std::vector<FfnParams> out(static_cast<std::size_t>(layers));
  for (const auto& p : layout) {
    if (p.layer < 0) continue;
    auto& f = out[static_cast<std::size_t>(p.layer)];
    if (ends_with(p.name, "ffn.w1.weight")) f.w1 = &p;
    if (ends_with(p.name, "ffn.w2.weight")) f.w2 = &p;
    if (ends_with(p.name, "ffn.w3.weight")) f.w3 = &p;
  }
  return out;
}

}  // namespace

double kept_fraction(std::int64_t round, std::int64_t theta, double target_sparsity) {
  return std::max(std::pow(0.1, static_cast<double>(round) / static_cast<double>(theta)), 1.0 - target_sparsity);
}

std::int64_t fixed_rounds(std::int64_t theta, double target_sparsity) {
  // 0.1^(r/theta) <= 1 - s  <=>  r >= theta * log10(1/(1-s)); 1e-9 keeps exact values exact.
  const double r = static_cast<double>(theta) * -std::log10(1.0 - target_sparsity);
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(r - 1e-9)));
}

std::vector<model::ParamInfo> prunable_parameters(const model::ModelDims& dims) {
  std::vector<model::ParamInfo> out;
  for (const auto& p : model::parameter_layout(dims))
    if (is_prunable(p)) out.push_back(p);
  return out;
}

std::int64_t prunable_count(const model::ModelDims& dims) {
  std::int64_t n = 0;
  for (const auto& p : prunable_parameters(dims)) n += p.numel;
  return n;
}

std::vector<std::uint8_t> full_mask(const model::ModelDims& dims) {
  return std::vector<std::uint8_t>(static_cast<std::size_t>(dims.parameter_count()), 1);
}

void prune_unstructured(const model::ModelDims& dims, const std::vector<float>& w, std::vector<std::uint8_t>& mask,
                        std::int64_t keep) {
  std::vector<std::int64_t> kept;
  for (const auto& p : prunable_parameters(dims))
    for (std::int64_t i = p.offset; i < p.offset + p.numel; ++i)
      if (mask[static_cast<std::size_t>(i)]) kept.push_back(i);
  const auto have = static_cast<std::int64_t>(kept.size());
  LMSCALE_CHECK(keep >= 0 && keep <= have, "prune_unstructured: keep {} of {} kept weights", keep, have);
  const std::int64_t remove = have - keep;
  if (remove == 0) return;
  // One global threshold: the `remove` smallest |w| (index order breaks ties).
  auto smaller = [&w](std::int64_t a, std::int64_t b) {
    const float x = std::fabs(w[static_cast<std::size_t>(a)]), y = std::fabs(w[static_cast<std::size_t>(b)]);
    return x != y ? x < y : a < b;
  };
  std::nth_element(kept.begin(), kept.begin() + (remove - 1), kept.end(), smaller);
  for (std::int64_t k = 0; k < remove; ++k) mask[static_cast<std::size_t>(kept[static_cast<std::size_t>(k)])] = 0;
}

UnitMask full_unit_mask(const model::ModelDims& dims) {
  return UnitMask(static_cast<std::size_t>(dims.layers), std::vector<std::uint8_t>(static_cast<std::size_t>(dims.d_ff), 1));
}

std::int64_t kept_units(const UnitMask& units) {
  return units.empty() ? 0 : std::count(units[0].begin(), units[0].end(), std::uint8_t{1});
}

void prune_units(const model::ModelDims& dims, const std::vector<float>& w, UnitMask& units, std::int64_t keep) {
  const auto layout = model::parameter_layout(dims);
  const auto ffn = ffn_params(layout, dims.layers);
  const std::int64_t F = dims.d_ff, d = dims.d_model;
  LMSCALE_CHECK(keep >= 1 && keep <= kept_units(units), "prune_units: keep {} of {} units", keep, kept_units(units));
  for (std::int64_t l = 0; l < dims.layers; ++l) {
    const auto& f = ffn[static_cast<std::size_t>(l)];
    auto& kept = units[static_cast<std::size_t>(l)];
    // Squared L2 norm of unit j: row j of w1 and w3 [F, d], column j of w2 [d, F].
    std::vector<double> norm(static_cast<std::size_t>(F), 0.0);
    for (std::int64_t j = 0; j < F; ++j) {
      double s = 0;
      for (std::int64_t i = 0; i < d; ++i) {
        const double a = w[static_cast<std::size_t>(f.w1->offset + j * d + i)];
        const double b = w[static_cast<std::size_t>(f.w3->offset + j * d + i)];
        const double c = w[static_cast<std::size_t>(f.w2->offset + i * F + j)];
        s += a * a + b * b + c * c;
      }
      norm[static_cast<std::size_t>(j)] = s;
    }
    std::vector<std::int64_t> alive;
    for (std::int64_t j = 0; j < F; ++j)
      if (kept[static_cast<std::size_t>(j)]) alive.push_back(j);
    std::sort(alive.begin(), alive.end(), [&norm](std::int64_t a, std::int64_t b) {
      const double x = norm[static_cast<std::size_t>(a)], y = norm[static_cast<std::size_t>(b)];
      return x != y ? x < y : a < b;
    });
    const std::int64_t remove = static_cast<std::int64_t>(alive.size()) - keep;
    for (std::int64_t k = 0; k < remove; ++k) kept[static_cast<std::size_t>(alive[static_cast<std::size_t>(k)])] = 0;
  }
}

std::vector<std::uint8_t> unit_element_mask(const model::ModelDims& dims, const UnitMask& units) {
  std::vector<std::uint8_t> mask = full_mask(dims);
  const auto layout = model::parameter_layout(dims);
  const auto ffn = ffn_params(layout, dims.layers);
  const std::int64_t F = dims.d_ff, d = dims.d_model;
  for (std::int64_t l = 0; l < dims.layers; ++l) {
    const auto& f = ffn[static_cast<std::size_t>(l)];
    for (std::int64_t j = 0; j < F; ++j) {
      if (units[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)]) continue;
      for (std::int64_t i = 0; i < d; ++i) {
        mask[static_cast<std::size_t>(f.w1->offset + j * d + i)] = 0;
        mask[static_cast<std::size_t>(f.w3->offset + j * d + i)] = 0;
        mask[static_cast<std::size_t>(f.w2->offset + i * F + j)] = 0;
      }
    }
  }
  return mask;
}

void apply_mask(std::vector<float>& w, const std::vector<std::uint8_t>& mask) {
  LMSCALE_CHECK(w.size() == mask.size(), "apply_mask: {} weights, {} mask entries", w.size(), mask.size());
  for (std::size_t i = 0; i < w.size(); ++i)
    if (!mask[i]) w[i] = 0.0f;
}

std::int64_t prunable_zeros(const model::ModelDims& dims, const std::vector<float>& w) {
  std::int64_t zeros = 0;
  for (const auto& p : prunable_parameters(dims))
    for (std::int64_t i = p.offset; i < p.offset + p.numel; ++i) zeros += w[static_cast<std::size_t>(i)] == 0.0f;
  return zeros;
}

std::vector<float> compact_units(const model::ModelDims& dims, const std::vector<float>& w, const UnitMask& units) {
  model::ModelDims small = dims;
  small.d_ff = kept_units(units);
  const auto from = model::parameter_layout(dims);
  const auto to = model::parameter_layout(small);
  LMSCALE_CHECK(from.size() == to.size(), "compact_units: layouts differ");
  const std::int64_t F = dims.d_ff, Fs = small.d_ff, d = dims.d_model;
  std::vector<float> out(static_cast<std::size_t>(small.parameter_count()));
  for (std::size_t p = 0; p < from.size(); ++p) {
    const auto& a = from[p];
    const auto& b = to[p];
    const auto& kept = a.layer >= 0 ? units[static_cast<std::size_t>(a.layer)] : units[0];
    const bool rows = ends_with(a.name, "ffn.w1.weight") || ends_with(a.name, "ffn.w3.weight");
    const bool cols = ends_with(a.name, "ffn.w2.weight");
    if (rows) {   // [F, d] -> [Fs, d]
      std::int64_t r = 0;
      for (std::int64_t j = 0; j < F; ++j)
        if (kept[static_cast<std::size_t>(j)])
          std::copy_n(w.begin() + a.offset + j * d, d, out.begin() + b.offset + (r++) * d);
    } else if (cols) {   // [d, F] -> [d, Fs]
      for (std::int64_t i = 0; i < d; ++i) {
        std::int64_t c = 0;
        for (std::int64_t j = 0; j < F; ++j)
          if (kept[static_cast<std::size_t>(j)]) out[static_cast<std::size_t>(b.offset + i * Fs + c++)] = w[static_cast<std::size_t>(a.offset + i * F + j)];
      }
    } else {
      LMSCALE_CHECK(a.numel == b.numel, "compact_units: {} changes size", a.name);
      std::copy_n(w.begin() + a.offset, a.numel, out.begin() + b.offset);
    }
  }
  return out;
}

}  // namespace lmscale::jobs
