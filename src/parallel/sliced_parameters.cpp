// Full parameters from a group's slices and back (parallel/sliced_parameters.h).
#include "lmscale/parallel/sliced_parameters.h"

#include "lmscale/core/error.h"
#include "lmscale/model/tensor_parallel.h"

namespace lmscale::parallel {

namespace {
// Offsets of the store's parameters whole, one after the other; returns their total.
std::int64_t whole_offsets(const std::vector<model::ParamInfo>& infos, std::vector<std::int64_t>& at) {
  std::int64_t total = 0;
  at.clear();
  for (const auto& p : infos) {
    at.push_back(total);
    total += p.full_shape.empty() ? p.numel : shape_numel(p.full_shape);
  }
  return total;
}
std::int64_t local_size(const std::vector<model::ParamInfo>& infos) {
  return infos.empty() ? 0 : infos.back().offset + infos.back().numel;
}
}  // namespace

std::vector<float> gather_sliced(comm::Communicator& host, const std::vector<model::ParamInfo>& infos,
                                 const std::vector<float>& local) {
  const int tp = host.size();
  LMSCALE_CHECK(local_size(infos) == static_cast<std::int64_t>(local.size()), "gather_full: {} local values for a "
                "layout of {}", local.size(), local_size(infos));
  std::vector<float> all(local.size() * static_cast<std::size_t>(tp));
  host.all_gather(local.data(), all.data(), local.size(), DType::f32).wait();
  std::vector<std::int64_t> at;
  std::vector<float> whole(static_cast<std::size_t>(whole_offsets(infos, at)));
  for (int q = 0; q < tp; ++q) {
    const float* from = all.data() + static_cast<std::size_t>(q) * local.size();
    for (std::size_t i = 0; i < infos.size(); ++i) {
      model::ParamInfo p = infos[i];   // rank q's slice: same local shape, its own position
      if (p.split_dim >= 0) p.split_begin = q * p.shape[static_cast<std::size_t>(p.split_dim)];
      model::copy_slice(p, whole.data() + at[i], const_cast<float*>(from) + p.offset, sizeof(float), true);
    }
  }
  return whole;
}

std::vector<float> slice_whole(const std::vector<model::ParamInfo>& infos, const std::vector<float>& whole) {
  std::vector<std::int64_t> at;
  LMSCALE_CHECK(whole_offsets(infos, at) == static_cast<std::int64_t>(whole.size()), "slice_local: {} values for "
                "parameters of {}", whole.size(), whole_offsets(infos, at));
  std::vector<float> local(static_cast<std::size_t>(local_size(infos)));
  std::vector<float>& src = const_cast<std::vector<float>&>(whole);   // copy_slice reads it (to_full = false)
  for (std::size_t i = 0; i < infos.size(); ++i)
    model::copy_slice(infos[i], src.data() + at[i], local.data() + infos[i].offset, sizeof(float), false);
  return local;
}

}  // namespace lmscale::parallel
