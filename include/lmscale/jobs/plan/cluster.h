#pragma once
// The cluster a plan is for (docs/planner.md, "Clusters"): GPUs per node, the GPU's peak FLOP/s,
// HBM bandwidth and memory, and the links inside and between nodes. plan.cluster picks a preset;
// the [cluster] keys override single figures; intra-node alpha and beta come from the calibration
// file unless the deck sets them.
#include <string>

#include "lmscale/io/config.h"
#include "lmscale/jobs/plan/calibration.h"

namespace lmscale::jobs::plan {

// One link class under the alpha-beta model: a collective step costs alpha, a byte 1/bus_bytes_per_s.
struct Link {
  double alpha_s = 0;
  double bus_bytes_per_s = 0;
};

struct Cluster {
  std::string name;                 // the preset's deck spelling
  int gpus_per_node = 8;
  double bf16_flops = 0, fp8_flops = 0;   // dense peak per GPU
  double hbm_bytes_per_s = 0;
  double memory_bytes = 0;          // per GPU, as CUDA reports it
  Link intra, inter;                // NVLink inside a node; the network (per GPU) between nodes
  std::string sources;              // where each figure comes from
};

// The preset of plan.cluster, without the deck's overrides.
Cluster cluster_preset(ClusterPreset p);
// plan.cluster with the [cluster] overrides; intra-node alpha and beta from `cal` unless set.
Cluster resolve_cluster(const Config& cfg, const Calibration& cal);
// inputs/calibration/h100.ini or h200.ini: the shipped calibration of the preset's GPU.
std::string default_calibration_path(ClusterPreset p);

}  // namespace lmscale::jobs::plan
