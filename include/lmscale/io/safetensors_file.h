#pragma once
// Weights files in the safetensors format (https://github.com/huggingface/safetensors, docs/hdf5.md
// "Weights in safetensors"): an 8-byte little-endian header length N, N bytes of JSON header
//   {"__metadata__": {"key": "text", ...},
//    "layers.0.attn.q_proj.weight": {"dtype": "F32", "shape": [d_model, d_model], "data_offsets": [b, e]}, ...}
// (padded with spaces so the data starts 8-byte aligned), then the tensors' bytes, little-endian,
// row-major, [b, e) relative to the end of the header. lmscale writes F32 tensors; it reads F32,
// F64, F16 and BF16 ones into float32. io::write_weights and io::CheckpointReader call this for
// names that end in ".safetensors" (weights_format.h).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lmscale/io/named_array.h"

namespace lmscale::io {

// Writes `params` (float32, in this order) and `metadata` (text values, the format's
// `__metadata__`) to PATH.tmp and renames it to PATH; parent directories are created; a failed
// write removes PATH.tmp. Duplicate, empty or "__metadata__" names, negative dimensions and null
// data throw Error naming the tensor.
void write_safetensors(const std::string& path, const std::vector<NamedArray>& params,
                       const std::map<std::string, std::string>& metadata);

class SafetensorsReader {
 public:
  // Reads and checks the header: every malformed piece (a short file, a header length past the end,
  // JSON that does not parse, an unknown dtype, a shape whose size disagrees with its
  // data_offsets, offsets outside the data or overlapping, a metadata value that is not a string)
  // throws Error naming the file and the tensor or key.
  explicit SafetensorsReader(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;   // tensors in the order of the header
  bool has(const std::string& name) const;
  std::vector<std::int64_t> shape(const std::string& name) const;   // Error if missing
  // Reads tensor `name` converted to float32 into `out` (product(expected_shape) floats); a missing
  // name or another shape throws Error naming the tensor and both shapes.
  void read(const std::string& name, const std::vector<std::int64_t>& expected_shape, float* out) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    std::string name;
    std::string dtype;   // "F32", "F64", "F16", "BF16"
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0, end = 0;   // byte offsets relative to the data
  };
  const Entry& entry(const std::string& name) const;

  std::string path_;
  std::uint64_t data_start_ = 0;   // 8 + header length
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace lmscale::io
