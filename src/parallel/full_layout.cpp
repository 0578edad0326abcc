#include "lmscale/parallel/full_layout.h"

#include <algorithm>

#include "lmscale/core/error.h"
#include "lmscale/parallel/expert_parallel.h"
#include "lmscale/parallel/tensor_parallel.h"

namespace lmscale::parallel {

FullLayout::FullLayout(const model::ModelDims& dims, const model::ParameterStore& store, TensorParallel* tp,
                       comm::Communicator* host_pp, int virtual_stages, std::vector<std::int64_t> stage_layers,
                       ExpertParallel* ep)
    : dims_(dims),
      store_(store),
      tp_(tp),
      ep_(ep),
      host_pp_(host_pp),
      virtual_stages_(virtual_stages),
      stage_layers_(std::move(stage_layers)) {
  LMSCALE_CHECK(!ep_ || (!tp_ && !host_pp_), "expert parallelism with tensor or pipeline parallelism is not built");
}

std::vector<float> FullLayout::to_full(const std::vector<float>& local) const {
  // Tensor parallel: the tp ranks' slices -> this store's parameters whole (in store order).
  std::vector<float> whole = tp_ ? tp_->gather_full(store_.infos(), local)
                             : ep_ ? ep_->gather_full(store_.infos(), local) : local;
  if (!host_pp_) return whole;   // the whole model: already the full layout
  // Pipeline: every rank's store (its chunks' parameters, in chunk order), all-gathered over the
  // pp group, then each parameter put at its place in the full layout.
  comm::Communicator& pp = *host_pp_;
  std::vector<std::size_t> counts(static_cast<std::size_t>(pp.size()));
  const double mine = static_cast<double>(whole.size());
  std::vector<double> all(counts.size());
  pp.all_gather(&mine, all.data(), 1, DType::f64).wait();
  std::size_t total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) total += counts[i] = static_cast<std::size_t>(all[i]);
  std::vector<float> gathered(total);
  pp.all_gather_v(whole.data(), gathered.data(), counts, DType::f32).wait();
  const auto layout = model::parameter_layout(dims_);
  std::vector<float> full(static_cast<std::size_t>(dims_.parameter_count()));
  std::size_t at = 0;
  for (int r = 0; r < pp.size(); ++r) {
    for (const auto& u : model::pipeline_chunks(dims_, pp.size(), virtual_stages_, r, stage_layers_)) {
      for (int g = u.first_param(dims_); g < u.end_param(dims_); ++g) {
        const auto& p = layout[static_cast<std::size_t>(g)];
        std::copy(gathered.begin() + static_cast<std::ptrdiff_t>(at),
                  gathered.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(p.numel)),
                  full.begin() + p.offset);
        at += static_cast<std::size_t>(p.numel);
      }
    }
  }
  LMSCALE_CHECK(at == total, "to_full_layout: {} gathered values, {} placed", total, at);
  return full;
}

std::vector<float> FullLayout::to_local(const std::vector<float>& full) const {
  LMSCALE_CHECK(static_cast<std::int64_t>(full.size()) == dims_.parameter_count(),
                "to_local_layout: {} values for a model of {}", full.size(), dims_.parameter_count());
  // This store's parameters whole, in store order (a pipeline stage: its chunks' parameters).
  std::vector<float> whole;
  if (host_pp_) {
    const auto layout = model::parameter_layout(dims_);
    for (int i = 0; i < store_.size(); ++i) {
      const auto& g = layout[static_cast<std::size_t>(store_.global_index(i))];
      whole.insert(whole.end(), full.begin() + g.offset, full.begin() + g.offset + g.numel);
    }
  } else {
    whole = full;
  }
  // Tensor or expert parallel: this rank's slices.
  if (ep_) return ep_->slice_local(store_.infos(), whole);
  return tp_ ? tp_->slice_local(store_.infos(), whole) : whole;
}

}  // namespace lmscale::parallel
