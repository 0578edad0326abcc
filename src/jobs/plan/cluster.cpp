#include "lmscale/jobs/plan/cluster.h"

namespace lmscale::jobs::plan {

Cluster cluster_preset(ClusterPreset p) {
  constexpr double MiB = 1024.0 * 1024.0;
  Cluster c;
  c.name = to_string(p);
  c.gpus_per_node = 8;
  // NVIDIA H100 and H200 Tensor Core GPU datasheets (SXM): 989.4 TFLOP/s dense bf16, 1978.9 fp8.
  c.bf16_flops = 989.4e12;
  c.fp8_flops = 1978.9e12;
  // Inside a node: NVLink 4 through NVSwitch, 450 GB/s per direction per GPU (datasheets); the
  // calibration's measured bus bandwidth replaces these (resolve_cluster).
  c.intra = {10e-6, 450e9};
  // Between nodes: one 400 Gb/s NIC per GPU (ConnectX-7 NDR) = 50 GB/s line rate, of which a ring
  // is assumed to reach 80% (40 GB/s bus bandwidth), with 10 us per step: assumptions, not measured
  // here (docs/planner.md).
  c.inter = {10e-6, 40e9};
  switch (p) {
    case ClusterPreset::h100_nvlink_ib400:
      c.hbm_bytes_per_s = 3.35e12;   // H100 SXM datasheet: 3.35 TB/s HBM3
      c.memory_bytes = 81559 * MiB;  // what CUDA reports on an H100 80GB HBM3 (docs/jobs.md, accounting)
      c.sources = "H100 SXM datasheet (989.4 TFLOP/s bf16, 1978.9 fp8, 3.35 TB/s, 80 GB as 81559 MiB), NVLink 4 "
                  "450 GB/s per direction, 400 Gb/s NDR per GPU at an assumed 80% (40 GB/s, 10 us)";
      break;
    case ClusterPreset::h200_nvlink_ib400:
      c.hbm_bytes_per_s = 4.8e12;     // H200 datasheet: 4.8 TB/s HBM3e
      c.memory_bytes = 143771 * MiB;  // what CUDA reports on an H200 (docs/jobs.md, accounting)
      c.sources = "H200 SXM datasheet (989.4 TFLOP/s bf16, 1978.9 fp8, 4.8 TB/s, 141 GB as 143771 MiB), NVLink 4 "
                  "450 GB/s per direction, 400 Gb/s NDR per GPU at an assumed 80% (40 GB/s, 10 us)";
      break;
  }
  return c;
}

Cluster resolve_cluster(const Config& cfg, const Calibration& cal) {
  Cluster c = cluster_preset(cfg.plan.cluster);
  const ClusterConfig& k = cfg.cluster;
  if (cal.intra_bus_bytes_per_s > 0) c.intra.bus_bytes_per_s = cal.intra_bus_bytes_per_s;
  if (cal.intra_alpha_s > 0) c.intra.alpha_s = cal.intra_alpha_s;
  if (k.gpus_per_node > 0) c.gpus_per_node = static_cast<int>(k.gpus_per_node);
  if (k.bf16_tflops > 0) c.bf16_flops = k.bf16_tflops * 1e12;
  if (k.fp8_tflops > 0) c.fp8_flops = k.fp8_tflops * 1e12;
  if (k.hbm_gbs > 0) c.hbm_bytes_per_s = k.hbm_gbs * 1e9;
  if (k.memory_gib > 0) c.memory_bytes = k.memory_gib * 1024.0 * 1024.0 * 1024.0;
  if (k.intra_gbs > 0) c.intra.bus_bytes_per_s = k.intra_gbs * 1e9;
  if (k.intra_us > 0) c.intra.alpha_s = k.intra_us * 1e-6;
  if (k.inter_gbs > 0) c.inter.bus_bytes_per_s = k.inter_gbs * 1e9;
  if (k.inter_us > 0) c.inter.alpha_s = k.inter_us * 1e-6;
  return c;
}

std::string default_calibration_path(ClusterPreset p) {
  return p == ClusterPreset::h100_nvlink_ib400 ? "inputs/calibration/h100.ini" : "inputs/calibration/h200.ini";
}

}  // namespace lmscale::jobs::plan
