// Weights and training checkpoints in HDF5 (include/lmscale/io/checkpoint.h, docs/hdf5.md); weights
// files whose name ends in .safetensors go to safetensors_file.cpp.
#include "lmscale/io/checkpoint.h"

#include <set>
#include <type_traits>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "edit_distance.h"
#include "h5_support.h"
#include "lmscale/core/error.h"
#include "lmscale/io/safetensors_file.h"
#include "lmscale/io/weights_format.h"
#include "lmscale/version.h"

namespace lmscale::io {

namespace {

constexpr const char* kSchema = "lmscale-checkpoint/1";
constexpr const char* kStateGroup = "state";   // write_weights' `state` arrays: /state/<name>

std::string shape_text(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// An attribute as safetensors metadata text: numbers in decimal (doubles in the shortest form that
// reads back exactly), arrays as "[a, b]".
std::string metadata_text(const AttrValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) return v;
        else if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, double>) return fmt::format("{}", v);
        else return fmt::format("[{}]", fmt::join(v, ", "));
      },
      value);
}

void check_name(const std::string& path, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "optimizer" || name == kStateGroup)
    throw Error(fmt::format("checkpoint '{}': invalid parameter name '{}' (empty, '.', 'optimizer', '{}' or containing "
                            "'/')",
                            path, name, kStateGroup));
}

void write_array(hid_t loc, const std::string& file, const std::string& dataset_path, const NamedArray& a) {
  h5::write_f32(loc, dataset_path, a.shape, a.data, fmt::format("checkpoint '{}': write '{}'", file, dataset_path));
}

}  // namespace

void write_weights(const std::string& path, const std::vector<NamedArray>& params,
                   const std::map<std::string, AttrValue>& attrs, const OptimizerArrays* optimizer,
                   const std::vector<NamedArray>* state) {
  if (weights_format(path) == WeightsFormat::safetensors) {
    if (optimizer || state)
      throw Error(fmt::format("checkpoint '{}': a safetensors file holds weights only, not optimizer or training state; name "
                              "training checkpoints .h5",
                              path));
    for (const auto& p : params) check_name(path, p.name);
    std::map<std::string, std::string> metadata{{"schema", kSchema},
                                                {"format", "pt"},   // what transformers' loader asks of a file
                                                {"version", kVersion},
                                                {"git_commit", kGitCommit},
                                                {"utc_time", h5::utc_now_iso8601()}};
    for (const auto& [name, value] : attrs) metadata[name] = metadata_text(value);
    write_safetensors(path, params, metadata);
    return;
  }
  const h5::QuietErrors quiet;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const auto& p : params) {
    check_name(path, p.name);
    if (!shapes.emplace(p.name, p.shape).second)
      throw Error(fmt::format("checkpoint '{}': parameter '{}' given twice", path, p.name));
  }
  if (optimizer) {
    for (const auto* moments : {&optimizer->m, &optimizer->v}) {
      std::set<std::string> seen;
      for (const auto& a : *moments) {
        const auto it = shapes.find(a.name);
        if (it == shapes.end())
          throw Error(fmt::format("checkpoint '{}': optimizer state for '{}', which is not a parameter", path, a.name));
        if (it->second != a.shape)
          throw Error(fmt::format("checkpoint '{}': optimizer state for '{}' has shape {} but the parameter has {}",
                                  path, a.name, shape_text(a.shape), shape_text(it->second)));
        if (!seen.insert(a.name).second)
          throw Error(fmt::format("checkpoint '{}': optimizer state for '{}' given twice", path, a.name));
      }
    }
  }

  if (state) {
    std::set<std::string> seen;
    for (const auto& a : *state)
      if (a.name.empty() || a.name.find('/') != std::string::npos || !seen.insert(a.name).second)
        throw Error(fmt::format("checkpoint '{}': state array name '{}' is empty, contains '/' or is given twice", path,
                                a.name));
  }
  const std::string tmp = h5::temporary_path(path);
  std::vector<std::string> created_dirs;
  h5::File file = h5::create_file(tmp, /*track_creation_order=*/true, &created_dirs);
  try {
    for (const auto& p : params) write_array(file.get(), path, p.name, p);
    if (optimizer) {
      for (const auto& a : optimizer->m) write_array(file.get(), path, "optimizer/m/" + a.name, a);
      for (const auto& a : optimizer->v) write_array(file.get(), path, "optimizer/v/" + a.name, a);
    }
    if (state)
      for (const auto& a : *state) write_array(file.get(), path, std::string(kStateGroup) + "/" + a.name, a);
    const h5::Object root(H5Oopen(file.get(), "/", H5P_DEFAULT), "open '/'");
    h5::write_attr(root.get(), "schema", std::string(kSchema));
    h5::write_attr(root.get(), "version", std::string(kVersion));
    h5::write_attr(root.get(), "git_commit", std::string(kGitCommit));
    h5::write_attr(root.get(), "utc_time", h5::utc_now_iso8601());
    for (const auto& [name, value] : attrs) h5::write_attr(root.get(), name, value);
    file.close(fmt::format("close '{}'", tmp));
  } catch (...) {
    // A half-written weights file is of no use: leave nothing behind.
    file.reset();
    h5::remove_abandoned(tmp, created_dirs);
    throw;
  }
  h5::commit_file(tmp, path);   // on failure the complete file stays as NAME.tmp (named in the error)
}

struct CheckpointReader::Impl {
  h5::File file;                                   // an HDF5 file, or
  std::unique_ptr<SafetensorsReader> safetensors;  // a .safetensors one (weights only)
};

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  const h5::QuietErrors quiet;
  auto impl = std::make_unique<Impl>();
  if (weights_format(path) == WeightsFormat::safetensors) {
    impl->safetensors = std::make_unique<SafetensorsReader>(path);
    impl_ = std::move(impl);
    return;
  }
  const h5::PropertyList fapl = h5::file_access_properties();
  impl->file = h5::File(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), fmt::format("open checkpoint '{}'", path));
  impl_ = std::move(impl);
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

std::vector<std::string> CheckpointReader::names() const {
  if (impl_->safetensors) return impl_->safetensors->names();
  const h5::QuietErrors quiet;
  std::vector<std::string> names;
  auto collect = [](hid_t group, const char* name, const H5L_info_t*, void* data) -> herr_t {
    try {   // no exception may cross the C library's frames
      if (h5::is_dataset(group, name)) static_cast<std::vector<std::string>*>(data)->push_back(name);
      return 0;
    } catch (...) {
      return -1;
    }
  };
  // Creation order when the writer tracked it (write_weights does), else by name.
  hsize_t index = 0;
  if (H5Literate(impl_->file.get(), H5_INDEX_CRT_ORDER, H5_ITER_INC, &index, collect, &names) < 0) {
    H5Eclear2(H5E_DEFAULT);
    names.clear();
    index = 0;
    h5::check_status(H5Literate(impl_->file.get(), H5_INDEX_NAME, H5_ITER_INC, &index, collect, &names),
                     fmt::format("list parameters of '{}'", path_));
  }
  return names;
}

bool CheckpointReader::has(const std::string& name) const {
  if (name.empty() || name.find('/') != std::string::npos) return false;
  if (impl_->safetensors) return impl_->safetensors->has(name);
  const h5::QuietErrors quiet;
  return h5::is_dataset(impl_->file.get(), name);
}

std::vector<std::int64_t> CheckpointReader::shape(const std::string& name) const {
  if (impl_->safetensors) return impl_->safetensors->shape(name);
  const h5::QuietErrors quiet;
  if (!has(name)) throw Error(fmt::format("checkpoint '{}': parameter '{}' not found", path_, name));
  return h5::dataset_shape(impl_->file.get(), name, fmt::format("checkpoint '{}': shape of '{}'", path_, name));
}

namespace {

void read_dataset(hid_t file, const std::string& file_path, const std::string& dataset_path, const std::string& label,
                  const std::vector<std::int64_t>& expected_shape, float* out, const std::vector<std::string>& names) {
  const std::string what = fmt::format("checkpoint '{}': read {}", file_path, label);
  if (!h5::is_dataset(file, dataset_path)) {
    const auto nearest = detail::nearest_name(dataset_path.substr(dataset_path.rfind('/') + 1), names);
    throw Error(fmt::format("checkpoint '{}': {} not found ({} parameters in the file{})", file_path, label,
                            names.size(), nearest ? fmt::format("; nearest: '{}'", *nearest) : std::string()));
  }
  h5::read_f32(file, dataset_path, expected_shape, out, what);
}

}  // namespace

void CheckpointReader::read(const std::string& name, const std::vector<std::int64_t>& expected_shape, float* out) const {
  if (impl_->safetensors) return impl_->safetensors->read(name, expected_shape, out);
  const h5::QuietErrors quiet;
  if (name.empty() || name.find('/') != std::string::npos)
    throw Error(fmt::format("checkpoint '{}': invalid parameter name '{}'", path_, name));
  read_dataset(impl_->file.get(), path_, name, fmt::format("parameter '{}'", name), expected_shape, out, names());
}

bool CheckpointReader::has_optimizer_state() const {
  if (impl_->safetensors) return false;
  const h5::QuietErrors quiet;
  // v is absent for optimizers with one state (sgd, lars: the momentum buffer is in m).
  return h5::exists(impl_->file.get(), "optimizer/m");
}

void CheckpointReader::read_optimizer(const std::string& moment, const std::string& name,
                                      const std::vector<std::int64_t>& expected_shape, float* out) const {
  if (impl_->safetensors) throw Error(fmt::format("checkpoint '{}': a safetensors file holds no optimizer state", path_));
  const h5::QuietErrors quiet;
  if (moment != "m" && moment != "v")
    throw Error(fmt::format("checkpoint '{}': optimizer moment must be 'm' or 'v', not '{}'", path_, moment));
  if (name.empty() || name.find('/') != std::string::npos)
    throw Error(fmt::format("checkpoint '{}': invalid parameter name '{}'", path_, name));
  read_dataset(impl_->file.get(), path_, fmt::format("optimizer/{}/{}", moment, name),
               fmt::format("optimizer state {} of '{}'", moment, name), expected_shape, out, names());
}

std::optional<std::vector<std::int64_t>> CheckpointReader::state_shape(const std::string& name) const {
  if (impl_->safetensors || name.empty() || name.find('/') != std::string::npos) return std::nullopt;
  const h5::QuietErrors quiet;
  const std::string at = std::string(kStateGroup) + "/" + name;
  if (!h5::is_dataset(impl_->file.get(), at)) return std::nullopt;
  return h5::dataset_shape(impl_->file.get(), at, fmt::format("checkpoint '{}': shape of '{}'", path_, at));
}

void CheckpointReader::read_state(const std::string& name, const std::vector<std::int64_t>& expected_shape,
                                  float* out) const {
  if (impl_->safetensors) throw Error(fmt::format("checkpoint '{}': a safetensors file holds no training state", path_));
  const h5::QuietErrors quiet;
  if (name.empty() || name.find('/') != std::string::npos)
    throw Error(fmt::format("checkpoint '{}': invalid state array name '{}'", path_, name));
  const std::string at = std::string(kStateGroup) + "/" + name;
  h5::read_f32(impl_->file.get(), at, expected_shape, out, fmt::format("checkpoint '{}': read '{}'", path_, at));
}

std::map<std::string, AttrValue> CheckpointReader::attrs() const {
  if (impl_->safetensors) return {impl_->safetensors->metadata().begin(), impl_->safetensors->metadata().end()};
  const h5::QuietErrors quiet;
  const h5::Object root(H5Oopen(impl_->file.get(), "/", H5P_DEFAULT), "open '/'");
  std::map<std::string, AttrValue> result;
  for (const auto& name : h5::attr_names(root.get())) result.emplace(name, h5::read_attr(root.get(), name));
  return result;
}

std::optional<AttrValue> CheckpointReader::attr(const std::string& name) const {
  if (impl_->safetensors) {
    const auto& metadata = impl_->safetensors->metadata();
    const auto it = metadata.find(name);
    if (it == metadata.end()) return std::nullopt;
    return AttrValue(it->second);
  }
  const h5::QuietErrors quiet;
  const h5::Object root(H5Oopen(impl_->file.get(), "/", H5P_DEFAULT), "open '/'");
  const htri_t found = H5Aexists(root.get(), name.c_str());
  h5::check_status(found, fmt::format("checkpoint '{}': look up attribute '{}'", path_, name));
  if (found == 0) return std::nullopt;
  return h5::read_attr(root.get(), name);
}

}  // namespace lmscale::io
