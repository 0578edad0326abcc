#pragma once
// The optimizer interface every training layout drives the same way (one process, DDP, ZeRO
// ranges, FSDP unit shards, tensor-parallel slices, pipeline stages): AdamW, SGD, LARS and LAMB.
//
// An optimizer owns its state over a contiguous range of `numel` elements (the whole flat
// parameter buffer, or the shard a rank holds). Its `segments` say which parameter each part of
// that range belongs to; layer-wise optimizers (LARS, LAMB) need them for their per-parameter
// trust ratios, the others ignore them. Elements in no segment (FSDP's padding) get no layer-wise
// update.
//
// One step:
//   begin_step();
//   if (layerwise()) {
//     std::vector<double> sums(norm_slots(), 0.0);
//     for each range this rank holds: accumulate_norms(ctx, params, grads, offset, grad_scale, sums);
//     <all-reduce (sum) sums over the ranks that hold pieces of the same parameters>;
//     set_norms(sums);
//   }
//   for each range: step_range(ctx, params, grads, lowp, offset, lr, grad_scale);
// accumulate_norms adds this rank's partial sums of squares of each parameter's pieces into
// sums[kNormSlots * param + k], so one all-reduce of the vector gives norms over the WHOLE
// parameters however they are sharded. For LAMB it also updates the moments (the update norm
// needs them), so it must see every element exactly once per step, like step_range.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"
#include "lmscale/io/config.h"
#include "lmscale/ops/ops.h"

namespace lmscale::optim {

// Part of an optimizer's state range that belongs to one parameter.
struct ParamSegment {
  std::int64_t offset = 0, numel = 0;   // in the optimizer's state range
  int param = 0;                        // index into the per-parameter norm sums
  // Trust ratio and weight decay apply (LARS, LAMB); false for RMSNorm gains, which the LAMB
  // paper's bias/LayerNorm exclusion covers: they get ratio 1 and no weight decay.
  bool layerwise = true;
};

class Optimizer {
 public:
  // Slots per parameter in the norm sums (LARS uses 2, LAMB 3; see ops/optimizer_steps.h).
  static constexpr int kNormSlots = 3;

  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;

  // Named state tensors, each of numel() elements in the master dtype (checkpoints save them):
  // adamw m, v; lamb m, v; sgd and lars momentum_buffer.
  int num_states() const { return static_cast<int>(states_.size()); }
  const std::string& state_name(int k) const { return names_[static_cast<std::size_t>(k)]; }
  Tensor& state(int k) { return states_[static_cast<std::size_t>(k)]; }
  std::size_t state_bytes() const;
  std::int64_t numel() const { return numel_; }

  std::int64_t steps() const { return t_; }
  void set_steps(std::int64_t t) { t_ = t; }
  void begin_step() { ++t_; }

  // Per-parameter trust ratios (LARS, LAMB).
  virtual bool layerwise() const { return false; }
  std::size_t norm_slots() const { return static_cast<std::size_t>(kNormSlots) * static_cast<std::size_t>(num_params_); }
  virtual void accumulate_norms(Context& ctx, const Tensor& params, const Tensor& grads, std::int64_t offset,
                                double grad_scale, std::vector<double>& sums);
  virtual void set_norms(const std::vector<double>& sums);

  // The update of elements [offset, offset + params.numel()) of the state; `lowp` (optional, same
  // size) receives the new parameters in the working dtype. grad_scale multiplies the gradients
  // first (1/loss scale and the clipping factor).
  virtual void step_range(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, std::int64_t offset,
                          double lr, double grad_scale) = 0;
  // step_range over [offset, offset + params.numel()) whose gradients lie in pieces (offsets
  // relative to `offset`, sorted, covering the range: one process's lazy gradient buckets). By
  // default one step_range per piece; AdamW runs them in one pass (ops::adamw_pieces).
  virtual void step_pieces(Context& ctx, Tensor& params, const std::vector<ops::GradPiece>& pieces, Tensor* lowp,
                           std::int64_t offset, double lr, double grad_scale);

  // FP8 GEMM weights cast in the step (lmscale/ops/fp8.h, Fp8WeightCast; offsets in the state's
  // range), which then covers the whole range in one step_range or step_pieces call. AdamW only
  // (the others throw); null: none.
  virtual void set_fp8_weight_casts(const std::vector<ops::Fp8WeightCast>* casts);

  // The whole step over the whole range on one rank that holds whole parameters (no reduction).
  void step(Context& ctx, Tensor& params, const Tensor& grads, Tensor* lowp, double lr, double grad_scale);

 protected:
  // num_params: the size of the norm-sum index space (the parameter store's count).
  Optimizer(std::int64_t numel, int num_params, std::vector<ParamSegment> segments);
  void add_state(const std::string& name, DType dtype, Context& ctx);
  // The segments overlapping [offset, offset + n) cut to it, with offsets relative to `offset`.
  std::vector<ParamSegment> segments_in(std::int64_t offset, std::int64_t n) const;
  void check_range(const char* who, std::int64_t offset, std::int64_t n, std::int64_t grads) const;

  std::int64_t numel_;
  int num_params_;
  std::vector<ParamSegment> segments_;   // sorted by offset, disjoint
  std::int64_t t_ = 0;

 private:
  std::vector<std::string> names_;
  std::vector<Tensor> states_;
};

// The optimizer optim.name names. segments: see ParamSegment (may be empty for adamw and sgd).
std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& cfg, std::int64_t numel, DType dtype, Context& ctx,
                                          int num_params, std::vector<ParamSegment> segments);

// Trust ratios (You et al.): 1 when either norm is 0 (fresh zero weights, or no update).
//   LARS: eta ||w|| / (||g|| + wd ||w||)          LAMB: ||w|| / ||r + wd w||
double lars_trust_ratio(double w_norm, double g_norm, double eta, double weight_decay);
double lamb_trust_ratio(double w_norm, double u_norm);

}  // namespace lmscale::optim
