#pragma once
// The measured rates the planner's step model reads (docs/planner.md, "Calibration"): GEMM and
// attention FLOP/s as curves over the FLOPs of one call, the effective bandwidth of elementwise
// kernels and of the optimizer, the idle gap per kernel launch, the alpha and beta of the
// collectives inside a node, and how much overlapped communication slows the compute beside it.
// `run.job = calibrate` measures them on its machine and writes the file; inputs/calibration/
// ships files built from the measurements of docs/performance.md and docs/gpu.md, each figure with
// its source.
//
// The file is INI text: `[section]` lines, `key = value` lines, `#` comments. Curves are
// `points = FLOPS:TFLOPS, FLOPS:TFLOPS, ...` (FLOPs of one call, achieved TFLOP/s).
#include <string>
#include <utility>
#include <vector>

namespace lmscale::jobs::plan {

// Achieved rate against the work of one call, interpolated linearly in log(work) between measured
// points; above the last point the last rate; below the first point the first rate x
// sqrt(work / its work) (small calls are latency-bound: their time falls slower than their work).
struct EfficiencyCurve {
  std::vector<std::pair<double, double>> points;   // (FLOPs of one call, FLOP/s), increasing FLOPs
  double rate(double work) const;
  // "1.05e10:358.5, 4.19e10:549" (FLOP/s printed as TFLOP/s).
  std::string text() const;
  bool operator==(const EfficiencyCurve&) const = default;
};

struct Calibration {
  std::string device;                  // "NVIDIA H200", or the measured machine's device name
  std::string source;                  // where the figures come from
  double peak_flops = 0;               // the dense 16-bit (CPU: fp32) peak the rates were measured against
  double hbm_bytes_per_s = 0;          // the device's datasheet memory bandwidth
  EfficiencyCurve gemm;                // one GEMM call (forward and backward alike)
  EfficiencyCurve attention;           // one causal attention forward + backward, FLOPs = 3.5 x forward's
  double elementwise_bytes_per_s = 0;  // effective rate over the step model's elementwise byte count
  double launch_gap_s = 0;             // idle device time per kernel launch
  double optimizer_bytes_per_s = 0;    // AdamW + gradient norm over the owned parameters
  double optimizer_bytes_per_param = 34;   // fp32 p, g, m, v read, p, m, v written, 16-bit copy, norm's read
  // parallel.offload (ops/host_adamw.h): the host AdamW's rate with every hardware thread of the
  // node (0 = not calibrated: the planner then refuses offload), and its bytes per parameter.
  double host_adamw_bytes_per_s = 0;
  double host_adamw_bytes_per_param = 30;   // fp32 p, g, m, v read, p, m, v written, 16-bit copy written
  double intra_alpha_s = 0;            // intra-node collective latency per ring step
  double intra_bus_bytes_per_s = 0;    // intra-node ring bus bandwidth per GPU
  int intra_ranks = 0;                 // ranks of the collective measurement
  double nccl_contention = 0;          // share of an overlapped NCCL collective's time added to the compute
  double copy_engine_contention = 0;   // the same for the copy-engine gradient exchange

  bool operator==(const Calibration&) const = default;
};

// Parses calibration text; `origin` names it in errors (UsageError: "FILE:LINE: ...").
Calibration parse_calibration(const std::string& text, const std::string& origin);
Calibration read_calibration(const std::string& path);
// The text parse_calibration reads back to the same values (shortest round-trip numbers).
std::string calibration_text(const Calibration& c);

}  // namespace lmscale::jobs::plan
