// Units of the numeric attributes of results files, one place for every job (docs/hdf5.md
// "Units"). A numeric attribute whose name is neither listed here nor follows a suffix rule is a
// programming error that ResultsFile::set_attr reports; the vocabulary is the one of docs/hdf5.md.
#include "lmscale/io/result_units.h"

#include <utility>

namespace lmscale::io {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// name -> unit, for names that do not say their unit by a suffix.
constexpr std::pair<std::string_view, std::string_view> kUnits[] = {
    // root
    {"world_size", ""},
    // train
    {"lr_effective", ""}, {"min_lr_effective", ""}, {"lr_scale", ""}, {"reference_batch", "sequences"},
    {"global_batch", "sequences"}, {"grad_accum", ""}, {"tokens_per_step", "tokens"}, {"first_loss", "nats"},
    {"final_loss", "nats"}, {"parameters", ""}, {"parameters_active", ""}, {"parameters_total", ""},
    {"expert_parameters", ""}, {"ep", ""}, {"expert_state_bytes_per_rank", "bytes"},
    {"all_to_all_bytes_per_step_per_rank", "bytes"}, {"wall_s", "s"}, {"gpu_hours", "h"}, {"cost", "currency"},
    {"interrupted", "bool"}, {"resumed_at_step", ""}, {"diverged", "bool"}, {"stopped_at_step", ""},
    {"data_unigram_entropy", "nats/byte"},
    // train and bench-model under precision.mode = fp8 (GROUP/fp8)
    {"fp8_history", "casts"}, {"fp8_margin", ""}, {"saturated_operands", ""},
    // bench-model
    {"batch_size", "sequences"}, {"context_length", "tokens"}, {"tokens_per_s", "tokens/s"},
    {"tokens_per_s_wall", "tokens/s"},
    {"flops_per_step", "FLOP"}, {"achieved_flops", "FLOP/s"}, {"peak_flops", "FLOP/s"}, {"mfu", ""},
    {"flops_per_step_causal", "FLOP"}, {"mfu_causal", ""}, {"ranks", ""}, {"bucket_mb", "MiB"},
    {"checkpoint_k", ""}, {"fsdp_prefetch", ""}, {"reshard_after_forward", "bool"}, {"exposed_comm_share", ""},
    {"predicted_comm_bytes_per_step", "bytes"}, {"predicted_flops_per_step", "FLOP"},
    {"predicted_flops_per_step_causal", "FLOP"}, {"tp", ""}, {"sequence_parallel", "bool"},
    {"predicted_tp_comm_bytes_per_step", "bytes"}, {"gemm_plans_made_per_step", ""},
    {"moe_expert_rows_max_over_mean", ""}, {"moe_ep_rank_rows_max_over_mean", ""},
    {"gemm_class_products_per_step", ""}, {"gemm_class_fallbacks_per_step", ""},
    {"gemm_grouped_calls_per_step", ""}, {"gemm_grouped_looped_products_per_step", ""},
    {"gemm_sm90_grouped_calls_per_step", ""}, {"cuda_graphs", "bool"},
    {"cuda_graph_replayed_steps", ""}, {"cuda_graph_captures", ""}, {"cuda_graph_nodes", ""},
    {"cuda_graph_pool_bytes", "bytes"},
    // bench-collectives
    {"nodes", ""}, {"warmup", ""}, {"steps", ""}, {"max_busbw_gbs", "GB/s"},
    // bench-attention
    {"oom_cases", ""},
    // bench-gemm
    {"gemm_rows", "tokens"}, {"d_model", ""}, {"d_ff", ""}, {"vocab_size", ""}, {"gemm_autotune", "bool"},
    // pipeline
    {"pp", ""}, {"microbatches", ""}, {"virtual_stages", ""}, {"theory_bubble_fraction", ""},
    {"measured_bubble_fraction", ""},
    // prune
    {"target_sparsity", ""}, {"gamma", ""}, {"theta", ""}, {"finetune_steps", ""}, {"pruned_set_size", ""},
    {"final_round", ""}, {"final_sparsity", ""}, {"final_val_loss", "nats"}, {"unpruned_val_loss", "nats"},
    {"loss_bound", "nats"},
    // accounting and its cost estimate
    {"world", ""}, {"local_batch", "sequences"}, {"comm_bytes_per_step_per_rank", "bytes"},
    {"host_bytes_per_rank", "bytes"}, {"host_peak_resident_bytes", "bytes"}, {"predicted_offload_host_bytes", "bytes"},
    {"predicted_offload_transfer_bytes_per_step", "bytes"}, {"host_transfer_bytes_per_step_per_rank", "bytes"}, {"peak_flops_per_device", "FLOP/s"},
    {"ideal_step_s", "s"}, {"tp_comm_bytes_per_step_per_rank", "bytes"}, {"analysis_flops_per_device", "FLOP/s"},
    {"analysis_link_bytes_per_s", "bytes/s"}, {"memory_phases_stage", ""}, {"tokens", "tokens"},
    {"flops_per_token", "FLOP"}, {"flops", "FLOP"}, {"gpus", ""}, {"peak_flops_per_gpu", "FLOP/s"},
    {"checkpoints", ""}, {"checkpoint_write_s", "s"}, {"preemptions", ""}, {"lost_per_preemption_h", "h"},
    {"wall_h", "h"}, {"price_per_gpu_hour", "currency/h"},
    // plan and calibrate
    {"batch_sequences", "sequences"}, {"gpus_per_node", ""}, {"intra_alpha_us", "us"}, {"intra_busbw_gbs", "GB/s"},
};

}  // namespace

std::optional<std::string> attribute_unit(std::string_view name) {
  for (const auto& [key, unit] : kUnits)
    if (key == name) return std::string(unit);
  if (ends_with(name, "_bytes") || name.find("_bytes_") != std::string_view::npos) return std::string("bytes");
  for (std::string_view stat : {"_ms", "_ms_mean", "_ms_std", "_ms_min", "_ms_max", "_ms_median"})
    if (ends_with(name, stat)) return std::string("ms");
  return std::nullopt;
}

}  // namespace lmscale::io
