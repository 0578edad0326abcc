#pragma once
// Internal parts of deck validation (io/deck.h validate()).
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "lmscale/io/checkpoint.h"
#include "lmscale/io/config.h"

namespace lmscale::io::detail {

// dp when given; else world_size / (tp * pp). For jobs that run the model (train, bench-model)
// tp * pp must divide the world size (UsageError otherwise); other jobs fall back to 1.
std::int64_t resolved_dp(const Config& c, int world_size);

// Every file the run reads or writes: aliases by file identity and the overwrite rule (UsageError
// naming the keys; deck_output_paths.cpp).
void check_output_paths(const Config& c, int world_size);

// train: the resume source against the deck (model, optimizer, step, newer checkpoints) and the
// checkpoint layout against the optimizer (deck_checkpoints.cpp).
void check_checkpoints(const Config& c, int world_size);

// The mixture-of-experts keys (model.moe_*, parallel.ep) against the model, the layout, the job and
// the device (deck_moe.cpp).
void check_moe(const Config& c, int world_size);

// The FP8 keys (precision.mode = fp8, precision.fp8_*) against each other, the layout, the model
// and the rows per micro-batch (deck_fp8.cpp).
void check_fp8(const Config& c, int world_size);

// run.job = bench-gemm: bench.gemm_precisions against the model (a dense block; fp8's multiples of
// 16) (deck_bench_gemm.cpp).
void check_bench_gemm(const Config& c);

// train.cuda_graphs against the job, the device, the layout and the modes a captured step cannot
// hold (deck_cuda_graphs.cpp).
void check_cuda_graphs(const Config& c, int world_size);

// What in a weights file or single-file checkpoint contradicts the deck's model keys (blocks,
// heads, vocabulary, width, rope_theta, norm_eps) as one sentence; nullopt when they agree.
std::optional<std::string> weights_mismatch(const Config& c, const CheckpointReader& r);

// The first [model] key that changes the function (vocab_size, d_model, d_ff, num_layers,
// num_heads, rope_theta, norm_eps) whose value recorded in a file's attributes (an attribute of
// its own, else the [model] section of `config`) differs from the deck's, as one sentence that
// names the key, both values and the setting to use; nullopt when all recorded ones agree
// (recorded_model_keys.cpp).
std::optional<std::string> recorded_model_mismatch(const ModelConfig& m, const std::map<std::string, AttrValue>& attrs);

}  // namespace lmscale::io::detail
