#pragma once
// All parameters of the model in one flat buffer, with named views (names and shapes of
// docs/architecture.md §2, in the reference model's named_parameters() order). Gradients live in a second
// flat buffer of the same layout, so data-parallel strategies can reduce them in one piece or in
// contiguous buckets. In mixed precision a third flat buffer holds the bf16/fp16 working copy
// that the matmuls read; the optimizer refreshes it in the same pass that updates the master.
// Under parallel.offload with a working copy the fp32 master of the matrices and embeddings lives
// with the host optimizer (parallel/offloaded_shards.h), and the store keeps fp32 only for what
// the forward reads in fp32 (MasterCopy::read_ranges).
#include <optional>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "lmscale/core/context.h"
#include "lmscale/core/tensor.h"
#include "lmscale/model/expert_parallel.h"
#include "lmscale/model/model_dims.h"
#include "lmscale/model/stage.h"
#include "lmscale/model/tensor_parallel.h"
#include "lmscale/ops/fp8_linear.h"

namespace lmscale::model {

struct ParamInfo {
  enum class Kind { embedding, linear, norm };
  std::string name;         // e.g. "layers.3.attn.q_proj.weight"
  Shape shape;              // [d_out, d_in] for linear, [V, d] for embedding, [d] for norms
  std::int64_t offset = 0;  // first element in the flat buffer
  std::int64_t numel = 0;
  Kind kind = Kind::linear;
  int layer = -1;           // block index, -1 outside blocks
  // This parameter and the next run one GEMM side by side (q|k|v, a dense block's w1|w3:
  // model/param_layout.h), so their gradients must stay back to back in every gradient layout:
  // gradient buckets never split such a group (parallel/grad_buckets.h).
  bool joins_next = false;
  // Tensor parallelism (model/tensor_parallel.h): this rank holds rows (split_dim 0) or columns
  // (split_dim 1) [split_begin, split_begin + shape[split_dim]) of the full_shape parameter;
  // split_dim -1: the whole parameter (full_shape == shape, or empty in hand-made infos).
  Shape full_shape;
  int split_dim = -1;
  std::int64_t split_begin = 0;
};

// The layout of every parameter, in order; depends only on the dims.
std::vector<ParamInfo> parameter_layout(const ModelDims& dims);

// Deterministic initial values of elements [begin, end) of parameter `p` (docs/architecture.md §2): linear
// weights truncated normal std sqrt(2/(d_in+d_out)) within +-3 std, embeddings std 1 within
// +-3, norms 1. A pure function of (seed, name, element index): any shard, any rank, same values.
void initial_values(const ParamInfo& p, std::uint64_t seed, std::int64_t begin, std::int64_t end, double* out);
// The same values written into dst (any device, any float dtype, dst.numel() == end - begin),
// computed on the host by several threads and copied in pieces of <= 64 Mi elements.
void fill_initial_values(const ParamInfo& p, std::uint64_t seed, std::int64_t begin, std::int64_t end, Tensor dst,
                         Context& ctx);

class ParameterStore {
 public:
  // Which flat buffers the store owns:
  //   params_and_grads  master (+ working copy) and gradients (DDP, zero1)
  //   params_only       master (+ working copy); gradients from a provider (one process, zero2:
  //                     per-bucket buffers)
  //   none              nothing: weights and gradients both come from providers (FSDP, which
  //                     holds shards and gathers a unit's weights around its use)
  enum class Buffers { params_and_grads, params_only, none };
  // How much of the fp32 master the store holds (with Buffers other than none):
  //   whole        every parameter's ([numel])
  //   read_ranges  with a working copy, only the ranges the forward reads from the master
  //                (master_read_ranges(): the norm weights), packed in offset order
  //                ([master_read_numel()]); the other parameters' master lives with their owner
  //                (parallel.offload: the host optimizer), and flat_params() is refused. Without a
  //                working copy the master is what the forward reads, so it is held whole.
  enum class MasterCopy { whole, read_ranges };
  // master: fp32 (or fp64 for gradient checks); lowp: bf16/fp16 working copy, or the same dtype
  // as master for none.
  // split: tensor parallelism; the store then holds this rank's slices (tensor_parallel_layout),
  // initialised with the full parameters' values.
  // chunks: a pipeline stage holds only the parameters of its unit range(s) (stage.h; several
  // with the interleaved schedule); infos() then lists those alone, in chunk order, with offsets
  // from the start of the store's buffer, and every index the store takes or reports is local
  // (local_index(global) maps the full model's parameter index to it). Empty: the whole model.
  // Both together (tp x pp): the stage's units, each parameter this tp rank's slice.
  // experts: expert parallelism (model/expert_parallel.h); the stacked expert tensors of the MoE
  // blocks hold this ep rank's experts only (expert_parallel_layout).
  // master_copy: MasterCopy above.
  ParameterStore(const ModelDims& dims, DType master, DType lowp, Allocator& alloc,
                 Buffers buffers = Buffers::params_and_grads, const TensorSplit& split = {},
                 std::vector<StageUnits> chunks = {StageUnits::all()}, const ExpertSplit& experts = {},
                 MasterCopy master_copy = MasterCopy::whole);

  // Fills the master weights (and the working copy) with initial_values(seed); grads zeroed.
  // (Buffers::none: the provider's owner initialises its shards itself.) Without a whole master
  // the working copy of the other parameters is the device cast of their fp32 initial values
  // (through an fp32 chunk: the rounding refresh_lowp would give).
  void init(std::uint64_t seed, Context& ctx);
  void zero_grads(Context& ctx);
  // Refreshes the working copy from the master weights (after loading a checkpoint); without a
  // whole master only the master-read ranges' entries (the others' master is not here).
  void refresh_lowp(Context& ctx);
  // Writes fp32 values of every parameter (src [numel], any device) into the master the store
  // holds and the whole working copy (cast as refresh_lowp casts).
  void write_master(Context& ctx, const Tensor& src);
  // The fp32 initial values of flat elements [begin, end) (those init() computed, from its seed)
  // into dst [end - begin] on any device: for the owner of a master the store does not hold.
  void initial_master(std::int64_t begin, std::int64_t end, Tensor dst, Context& ctx) const;

  const std::vector<ParamInfo>& infos() const { return infos_; }
  int size() const { return static_cast<int>(infos_.size()); }
  const std::vector<StageUnits>& chunks() const { return chunks_; }
  // The one unit range of a store with a single chunk (the whole model or one pipeline stage).
  const StageUnits& units() const;
  // Local index of the full model's parameter `global` (throws when this store does not hold it)
  // and back.
  int local_index(int global) const;
  int global_index(int local) const { return global_of_[static_cast<std::size_t>(local)]; }
  const TensorSplit& tensor_split() const { return split_; }
  const ExpertSplit& expert_split() const { return experts_; }
  int index(const std::string& name) const;   // throws on unknown names
  std::int64_t numel() const { return total_; }
  DType master_dtype() const { return master_; }
  // The dtype the forward computes in (bf16/fp16 in mixed precision, else the master dtype).
  DType lowp_dtype() const { return lowp_dtype_; }
  bool has_lowp() const { return has_lowp_; }

  // Whether the store holds flat buffers (not FSDP's providers).
  bool has_flat_params() const { return has_flat_params_; }
  // Whether it holds the whole fp32 master (flat_params()); else MasterCopy::read_ranges.
  bool has_whole_master() const { return has_flat_params_ && whole_master_; }
  Tensor& flat_params();
  // fp32 master elements [offset, offset + n) of the flat layout: any range of a whole master,
  // else a range inside master_read_ranges() (adjacent ranges are adjacent in the packed buffer).
  Tensor master_view(std::int64_t offset, std::int64_t n) const;
  // MasterCopy::read_ranges: the packed fp32 master of master_read_ranges() [master_read_numel()].
  Tensor& packed_master_reads();
  std::int64_t master_read_numel() const;
  bool has_flat_grads() const { return has_flat_grads_; }
  Tensor& flat_grads();
  // Where gradient i lives when there is no flat buffer: called by grad(i) each time the
  // backward asks for it (the provider allocates on first use).
  using GradProvider = std::function<Tensor(int)>;
  void set_grad_provider(GradProvider p) { provider_ = std::move(p); }
  // What compute_weight(i) returns when the store has no flat buffers (FSDP's gathered weights).
  using WeightProvider = std::function<Tensor(int)>;
  void set_weight_provider(WeightProvider p) { weights_ = std::move(p); }
  // Where a weight that the provider hands out quantised (compute_weight(i) of dtype fp8_e4m3:
  // fsdp's FP8 weight gathers, parallel/fsdp_fp8_gather.h) finds its amax and scales.
  using Fp8WeightProvider = std::function<ops::Fp8Weight(int)>;
  void set_fp8_weight_provider(Fp8WeightProvider p) { fp8_weights_ = std::move(p); }
  // Parameter i as an FP8 GEMM operand when compute_weight(i) is fp8_e4m3 (refused otherwise).
  ops::Fp8Weight fp8_weight(int i) const;
  Tensor& flat_lowp() { return has_lowp_ ? lowp_ : flat_params(); }
  // Parameter i's fp32 master (without a whole master: the master-read parameters only).
  Tensor param(int i) const;
  Tensor grad(int i) const;
  // What the forward reads for parameter i: the working copy for matmuls and embeddings in mixed
  // precision, the master weights otherwise (norm weights are always read in full precision).
  Tensor compute_weight(int i) const;
  // The flat ranges (offset, numel) the forward reads from the master although a working copy
  // exists (the norm weights, in offset order); empty without a working copy. Whoever refreshes
  // the working copy alone (ZeRO's gather) must refresh these master ranges too.
  std::vector<std::pair<std::int64_t, std::int64_t>> master_read_ranges() const;

 private:
  Tensor view(const Tensor& flat, int i) const;
  // Whether compute_weight reads parameter p from the master (no working copy, or a norm weight).
  bool reads_master(const ParamInfo& p) const;
  std::vector<ParamInfo> infos_;
  std::vector<StageUnits> chunks_;
  std::vector<int> local_of_;    // full-model index -> local index, -1 when not held
  std::vector<int> global_of_;   // local index -> full-model index
  TensorSplit split_;
  ExpertSplit experts_;
  std::int64_t total_ = 0;
  DType master_, lowp_dtype_;
  Tensor params_, grads_, lowp_;   // params_: [numel], or [master_read_numel()] packed
  bool has_lowp_ = false;
  bool has_flat_params_ = true;
  bool whole_master_ = true;
  std::vector<std::int64_t> packed_at_;   // read_ranges: per parameter, its offset in params_ or -1
  std::optional<std::uint64_t> seed_;     // init()'s
  bool has_flat_grads_ = true;
  GradProvider provider_;
  WeightProvider weights_;
  Fp8WeightProvider fp8_weights_;
};

}  // namespace lmscale::model
