#include "lmscale/jobs/plan/calibration.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "lmscale/core/error.h"

namespace lmscale::jobs::plan {

double EfficiencyCurve::rate(double work) const {
  if (points.empty()) throw Error("EfficiencyCurve::rate: no points");
  if (points.size() == 1 || work >= points.back().first) return points.back().second;
  // Below the first point the call is latency-bound: time grows as sqrt(work), so the rate falls
  // as sqrt(work) (an assumption between a constant time and a constant rate; docs/planner.md).
  if (work < points.front().first) return points.front().second * std::sqrt(work / points.front().first);
  std::size_t i = 0;   // the segment [i, i+1] holding work
  while (i + 2 < points.size() && work >= points[i + 1].first) ++i;
  const double x = std::log(work), x0 = std::log(points[i].first), x1 = std::log(points[i + 1].first);
  const double y0 = points[i].second, y1 = points[i + 1].second;
  return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

std::string EfficiencyCurve::text() const {
  std::string out;
  for (const auto& [w, r] : points) out += fmt::format("{}{}:{}", out.empty() ? "" : ", ", w, r / 1e12);
  return out;
}

namespace {

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

}  // namespace

Calibration parse_calibration(const std::string& text, const std::string& origin) {
  Calibration c;
  std::istringstream in(text);
  std::string line, section;
  std::map<std::string, int> seen;   // section.key -> line
  int n = 0;
  auto fail = [&](const std::string& what) -> void {
    throw UsageError(fmt::format("{}:{}: {} (plan.calibration: docs/planner.md describes the file; run.job = "
                                 "calibrate writes one)",
                                 origin, n, what));
  };
  auto number = [&](const std::string& v) {
    std::size_t used = 0;
    double x = 0;
    try {
      x = std::stod(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || !std::isfinite(x) || x < 0) fail(fmt::format("'{}' is not a number >= 0", v));
    return x;
  };
  auto curve = [&](const std::string& v) {
    EfficiencyCurve k;
    std::istringstream items(v);
    std::string item;
    while (std::getline(items, item, ',')) {
      item = trim(item);
      const auto colon = item.find(':');
      if (colon == std::string::npos) fail(fmt::format("curve point '{}' is not FLOPS:TFLOPS", item));
      const double w = number(trim(item.substr(0, colon))), r = number(trim(item.substr(colon + 1)));
      if (w <= 0 || r <= 0) fail(fmt::format("curve point '{}' needs FLOPs and TFLOP/s > 0", item));
      if (!k.points.empty() && w <= k.points.back().first) fail("curve points must have increasing FLOPs");
      k.points.emplace_back(w, r * 1e12);
    }
    if (k.points.empty()) fail("a curve needs at least one point");
    return k;
  };
  while (std::getline(in, line)) {
    ++n;
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    if (line.front() == '[') {
      if (line.back() != ']') fail(fmt::format("'{}' is not a [section] line", line));
      section = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos) fail(fmt::format("'{}' is not key = value", line));
    const std::string key = section + "." + trim(line.substr(0, eq)), v = trim(line.substr(eq + 1));
    if (seen.count(key)) fail(fmt::format("{} repeats line {}", key, seen[key]));
    seen[key] = n;
    if (key == "device.name") c.device = v;
    else if (key == "device.source") c.source = v;
    else if (key == "device.peak_tflops") c.peak_flops = number(v) * 1e12;
    else if (key == "device.hbm_gbs") c.hbm_bytes_per_s = number(v) * 1e9;
    else if (key == "gemm.points") c.gemm = curve(v);
    else if (key == "attention.points") c.attention = curve(v);
    else if (key == "memory.elementwise_gbs") c.elementwise_bytes_per_s = number(v) * 1e9;
    else if (key == "memory.launch_gap_us") c.launch_gap_s = number(v) * 1e-6;
    else if (key == "memory.optimizer_gbs") c.optimizer_bytes_per_s = number(v) * 1e9;
    else if (key == "memory.optimizer_bytes_per_param") c.optimizer_bytes_per_param = number(v);
    else if (key == "collective.intra_alpha_us") c.intra_alpha_s = number(v) * 1e-6;
    else if (key == "collective.intra_busbw_gbs") c.intra_bus_bytes_per_s = number(v) * 1e9;
    else if (key == "collective.intra_ranks") c.intra_ranks = static_cast<int>(number(v));
    else if (key == "overlap.nccl_contention") c.nccl_contention = number(v);
    else if (key == "overlap.copy_engine_contention") c.copy_engine_contention = number(v);
    else if (key == "host.adamw_gbs") c.host_adamw_bytes_per_s = number(v) * 1e9;
    else if (key == "host.adamw_bytes_per_param") c.host_adamw_bytes_per_param = number(v);
    else fail(fmt::format("unknown key {}", key));
  }
  n = 0;
  for (const char* k : {"device.peak_tflops", "device.hbm_gbs", "gemm.points", "attention.points",
                        "memory.elementwise_gbs", "memory.optimizer_gbs", "collective.intra_busbw_gbs"})
    if (!seen.count(k)) fail(fmt::format("{} is missing", k));
  if (c.peak_flops <= 0 || c.hbm_bytes_per_s <= 0 || c.elementwise_bytes_per_s <= 0 || c.optimizer_bytes_per_s <= 0 ||
      c.intra_bus_bytes_per_s <= 0)
    fail("peak_tflops, hbm_gbs, elementwise_gbs, optimizer_gbs and intra_busbw_gbs must be > 0");
  return c;
}

Calibration read_calibration(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw UsageError(fmt::format("plan.calibration = '{}' cannot be read; give an existing calibration file "
                                       "(inputs/calibration/*.ini, or one written by run.job = calibrate)",
                                       path));
  std::stringstream s;
  s << f.rdbuf();
  return parse_calibration(s.str(), path);
}

std::string calibration_text(const Calibration& c) {
  return fmt::format(
      "# lmscale calibration (docs/planner.md, \"Calibration\")\n"
      "[device]\nname = {}\nsource = {}\npeak_tflops = {}\nhbm_gbs = {}\n"
      "[gemm]\npoints = {}\n[attention]\npoints = {}\n"
      "[memory]\nelementwise_gbs = {}\nlaunch_gap_us = {}\noptimizer_gbs = {}\noptimizer_bytes_per_param = {}\n"
      "[collective]\nintra_alpha_us = {}\nintra_busbw_gbs = {}\nintra_ranks = {}\n"
      "[overlap]\nnccl_contention = {}\ncopy_engine_contention = {}\n"
      "[host]\nadamw_gbs = {}\nadamw_bytes_per_param = {}\n",
      c.device, c.source, c.peak_flops / 1e12, c.hbm_bytes_per_s / 1e9, c.gemm.text(), c.attention.text(),
      c.elementwise_bytes_per_s / 1e9, c.launch_gap_s * 1e6, c.optimizer_bytes_per_s / 1e9,
      c.optimizer_bytes_per_param, c.intra_alpha_s * 1e6, c.intra_bus_bytes_per_s / 1e9, c.intra_ranks,
      c.nccl_contention, c.copy_engine_contention, c.host_adamw_bytes_per_s / 1e9, c.host_adamw_bytes_per_param);
}

}  // namespace lmscale::jobs::plan
