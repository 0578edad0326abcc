#pragma once
// The planner's layouts (docs/planner.md, "Layout search"): the deck with a dp x tp x pp mesh, a
// data-parallel strategy (ZeRO level), an activation checkpointing policy and a micro-batch count
// applied, checked as the run would be (io::validate: a layout the run refuses is dropped), its
// memory per rank predicted by the memory model's replay (the CUDA column) and judged against the
// cluster's GPU, and its step predicted by the step model. Ranked by predicted tokens/s per GPU,
// layouts that do not fit last.
#include <cstdint>
#include <string>
#include <vector>

#include "lmscale/io/config.h"
#include "lmscale/jobs/plan/step_model.h"

namespace lmscale::jobs::plan {

struct Candidate {
  Config cfg;              // the deck with this layout applied, as a bench-model train step of the batch
  int dp = 1, tp = 1, pp = 1;
  std::string family;      // "one gpu", "ddp", "zero1", "zero2", "fsdp", "+tp", "+pp" combinations
  std::string layout;      // parallel::Spec::describe plus checkpointing and micro-batches
  double memory_bytes = 0; // predicted peak per rank (largest stage)
  bool fits = false;       // memory_bytes <= the cluster GPU's memory
  bool deck = false;       // the deck's own layout
  StepPrediction step;
};

// The deck's model and training keys with `layout`'s [parallel] and checkpointing keys, planned as
// a train step of `batch` sequences on `gpus` GPUs; the refusal of io::validate, or empty.
std::string layout_refusal(const Config& layout, int gpus);
// Memory and step of one layout (not validated: call layout_refusal first).
Candidate evaluate_layout(const Config& layout, std::int64_t batch, int gpus, const Cluster& cluster,
                          const Calibration& cal);
// The deck's own layout on `gpus` GPUs (parallel.dp = 0 resolves against them).
Config deck_layout(const Config& deck, std::int64_t batch, int gpus);

struct SearchSpace {
  bool checkpointing = true;    // none, selective, every-k (k = 1); false: none and every-k
  bool accumulation = true;     // grad_accum 1, 2, 4, 8 without stages; false: 1
  bool sequence_parallel = true;
  int max_pp = 16;
};
// Every layout of `gpus` GPUs the run would start, evaluated.
std::vector<Candidate> search_layouts(const Config& deck, std::int64_t batch, int gpus, const Cluster& cluster,
                                      const Calibration& cal, const SearchSpace& space = {});
// Fitting layouts first, by predicted tokens/s per GPU (highest first); then those that do not fit,
// by memory (smallest first).
void rank_layouts(std::vector<Candidate>& layouts);

}  // namespace lmscale::jobs::plan
