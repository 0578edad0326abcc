#pragma once
// Producer amaxes on the CPU (lmscale/ops/ops.h): the maximum of fp8_rule::abs_bits over the
// values an op stores, taken from the stored elements themselves (fp64 rounded to fp32 first, as
// ops::amax reads them), so it is bitwise ops::amax of the output.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../fp8_scale_rule.h"
#include "dtype_dispatch.h"
#include "lmscale/core/tensor.h"

namespace lmscale::ops::cpu {

class ProducerAmax {
 public:
  // out: the op's amax argument (null: nothing is accumulated or stored).
  explicit ProducerAmax(Tensor* out) : out_(out) {}
  // One stored element.
  template <class T>
  void add(T stored) {
    if (out_) bits_ = std::max(bits_, fp8_rule::abs_bits(load_f32(stored)));
  }
  // Writes the maximum (0 when nothing was added) into the op's amax.
  void store() const {
    if (out_) std::memcpy(out_->data(), &bits_, 4);
  }

 private:
  Tensor* out_;
  std::uint32_t bits_ = 0;
};

}  // namespace lmscale::ops::cpu
