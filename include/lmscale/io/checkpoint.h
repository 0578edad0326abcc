#pragma once
// Weights files and training checkpoints (HDF5, docs/architecture.md §2, docs/hdf5.md). One float32 dataset
// per parameter at the root, named exactly like the parameter ("layers.0.attn.q_proj.weight",
// shape as given), so that in Python
//   {k: torch.from_numpy(f[k][()]) for k in f if isinstance(f[k], h5py.Dataset)}
// is a state_dict the reference model loads with no renaming. A training checkpoint adds the
// optimizer state as /optimizer/m/<name> and /optimizer/v/<name> (float32, same shapes: AdamW's
// and LAMB's moments; SGD's and LARS's momentum buffer in m, no v), other training state under
// /state/ (delayed FP8 scaling's amax histories and scales), and root attributes (step,
// seed, data position, loss scale, optimizer name, config, ...). Files are written as
// NAME.tmp and renamed to NAME, so a crash never leaves a half-written checkpoint under NAME.
// A name ending in .safetensors (weights_format.h) is a safetensors weights file instead
// (safetensors_file.h): the same parameter names and shapes, the attributes as text metadata, no
// optimizer state.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lmscale/io/named_array.h"
#include "lmscale/io/attr_value.h"

namespace lmscale::io {

// The optimizer's state tensors 0 (m) and 1 (v, may be empty); each entry's name and shape must
// be a parameter's.
struct OptimizerArrays {
  std::vector<NamedArray> m;
  std::vector<NamedArray> v;
};

// Writes `params` (and `optimizer` when given) to PATH.tmp, adds root attributes `schema`
// ("lmscale-checkpoint/1"), `version`, `git_commit`, `utc_time` and then `attrs` (which may add
// or override keys), and renames to PATH. Parent directories are created. Duplicate or invalid
// names, null data and moments without a matching parameter throw Error naming the array.
// PATH ending in .safetensors: the weights and, as text metadata, `schema`, `format` ("pt"),
// `version`, `git_commit`, `utc_time` and `attrs`; `optimizer` or `state` given throws Error.
// `state`: further training state (float32 arrays of any shape) at /state/<name>, names without
// '/' (the FP8 scaling state: jobs/engine/fp8_checkpoint_state.h); HDF5 files only.
void write_weights(const std::string& path, const std::vector<NamedArray>& params,
                   const std::map<std::string, AttrValue>& attrs = {}, const OptimizerArrays* optimizer = nullptr,
                   const std::vector<NamedArray>* state = nullptr);

class CheckpointReader {
 public:
  // Error if missing or not HDF5 (or, for a name ending in .safetensors, not a well-formed
  // safetensors file; then attrs() are its metadata, as strings, and there is no optimizer state).
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;

  const std::string& path() const { return path_; }
  // Parameter names (root datasets) in the order they were written.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const;
  std::vector<std::int64_t> shape(const std::string& name) const;   // Error if missing
  // Reads parameter `name` into `out` (product(expected_shape) floats). A missing name or a
  // shape different from `expected_shape` throws Error naming the parameter and both shapes.
  void read(const std::string& name, const std::vector<std::int64_t>& expected_shape, float* out) const;

  bool has_optimizer_state() const;   // /optimizer/m and /optimizer/v exist
  // moment: "m" or "v"; same checks as read().
  void read_optimizer(const std::string& moment, const std::string& name,
                      const std::vector<std::int64_t>& expected_shape, float* out) const;

  // write_weights' `state` array `name`: its shape (nullopt when the file has none, or is a
  // safetensors file), its values (Error for a name with '/', a missing array or another shape).
  std::optional<std::vector<std::int64_t>> state_shape(const std::string& name) const;
  void read_state(const std::string& name, const std::vector<std::int64_t>& expected_shape, float* out) const;

  std::map<std::string, AttrValue> attrs() const;   // root attributes
  std::optional<AttrValue> attr(const std::string& name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace lmscale::io
