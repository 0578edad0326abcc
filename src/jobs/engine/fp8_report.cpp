#include "lmscale/jobs/engine/fp8_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "lmscale/core/fp8.h"
#include "lmscale/model/fp8_layers.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/ops.h"

namespace lmscale::jobs {

namespace {

constexpr const char* kOperands[] = {"x", "w", "dy"};

// Operand i (x, w, dy) of block l's layer g.
const ops::Fp8TensorScaling& operand(const model::Fp8Layers& layers, int l, model::Fp8Gemm g, int i) {
  const ops::Fp8Linear& lin = layers.at(l, g);
  return i == 0 ? lin.x_scaling() : i == 1 ? lin.w_scaling() : lin.dy_scaling();
}

// One operand's state on the host: its amax history, oldest cast first (the ring buffer rotated
// so that the slot the next cast fills comes first), and its scale.
struct HostScaling {
  std::vector<float> history;
  float scale = 1.f;
  std::optional<float> last_cast;   // the last cast's amax where it is not the history's newest
  float last() const { return last_cast ? *last_cast : history.back(); }
  float window_max() const { return *std::max_element(history.begin(), history.end()); }
};

// precision.fp8_fast_accum's spelling of the layers' accumulation (docs/precision.md). A deck makes
// the gradients fast only with the forward; options made in code may not.
std::string fast_accum_name(const ops::Fp8LinearOptions& o) {
  const bool fwd = o.forward_accumulation == ops::Fp8Accumulation::fast;
  const bool grad = o.grad_accumulation == ops::Fp8Accumulation::fast;
  if (grad && !fwd) return "gradients";
  return to_string(grad ? Fp8FastAccum::all : fwd ? Fp8FastAccum::forward : Fp8FastAccum::none);
}

HostScaling read(Context& ctx, const ops::Fp8TensorScaling& s) {
  Tensor sc = Tensor::empty({1}, DType::f32, *ctx.host, "fp8_report");
  ops::copy(ctx, s.scale(), sc);
  HostScaling out;
  out.history = s.history_oldest_first(ctx);
  out.scale = *sc.data_as<const float>();
  return out;
}

}  // namespace

Fp8Recorder::Fp8Recorder(JobEnv& env, Trainer& trainer, std::string group)
    : env_(env), trainer_(trainer), group_(std::move(group)) {
  if (!trainer.recording_model().fp8()) return;
  using C = io::Column;
  table_ = env.out.create_table(group_ + "/fp8", {{"step", C::Type::i64, ""},
                                                  {"layer", C::Type::i64, ""},
                                                  {"gemm", C::Type::str, ""},
                                                  {"operand", C::Type::str, ""},
                                                  {"amax", C::Type::f64, ""},
                                                  {"amax_window_max", C::Type::f64, ""},
                                                  {"scale", C::Type::f64, ""},
                                                  {"saturated", C::Type::i64, "bool"}});
}

void Fp8Recorder::record(std::int64_t step) {
  if (!table_) return;
  model::TransformerLM& m = trainer_.recording_model();
  const model::Fp8Layers& layers = *m.fp8();
  // Weights the optimizer step casts (model/fp8_weight_casts.h): their last cast is the step's,
  // whose amax waits outside the history until the next step records it.
  model::Fp8WeightCasts* casts = m.fp8_weight_casts();
  Context& ctx = env_.rt.ctx();
  env_.rt.synchronize();
  std::vector<io::Row> rows;
  for (int l = layers.first_layer(); l < layers.end_layer(); ++l)
    for (const model::Fp8Gemm gemm : model::kFp8BlockGemms) {
      for (int i = 0; i < 3; ++i) {
        const ops::Fp8TensorScaling& s = operand(layers, l, gemm, i);
        HostScaling h = read(ctx, s);
        if (i == 1 && casts && casts->ready()) {
          Tensor a = Tensor::empty({1}, DType::f32, *ctx.host, "fp8_report");
          ops::copy(ctx, casts->weight(m.fp8_cast_index(l, gemm)).amax, a);
          h.last_cast = *a.data_as<const float>();
        }
        // The last cast used the scale in place now (a cast updates the scale before it reads x).
        const bool saturated = static_cast<double>(h.last()) * h.scale > fp8_max(s.format());
        const std::string name = fmt::format("layers.{}.{}.{}", l, model::fp8_gemm_name(gemm), kOperands[i]);
        if (saturated && warned_.insert(name).second)
          fmt::print(stderr,
                     "lmscale: warning: rank {}: FP8 cast of {} saturated at step {} (amax {:.4g} x scale {:.4g} > "
                     "{:.0f}: values were clipped); more headroom: precision.fp8_margin, or precision.fp8_scaling = "
                     "current\n",
                     env_.rank, name, step, h.last(), h.scale, fp8_max(s.format()));
        rows.push_back({step, static_cast<std::int64_t>(l), std::string(model::fp8_gemm_name(gemm)),
                        std::string(kOperands[i]), static_cast<double>(h.last()), static_cast<double>(h.window_max()),
                        static_cast<double>(h.scale), static_cast<std::int64_t>(saturated)});
      }
    }
  table_->append_rows(rows);
  table_->flush();
}

void Fp8Recorder::finish() {
  if (!table_) return;
  const model::Fp8Layers& layers = *trainer_.recording_model().fp8();
  Context& ctx = env_.rt.ctx();
  env_.rt.synchronize();
  const std::int64_t L = layers.end_layer() - layers.first_layer();
  std::int64_t H = 0;
  std::vector<float> all;
  for (int l = layers.first_layer(); l < layers.end_layer(); ++l)
    for (const model::Fp8Gemm gemm : model::kFp8BlockGemms)
      for (int i = 0; i < 3; ++i) {
        const HostScaling h = read(ctx, operand(layers, l, gemm, i));
        H = static_cast<std::int64_t>(h.history.size());
        all.insert(all.end(), h.history.begin(), h.history.end());
      }
  const std::int64_t G = model::kFp8GemmsPerBlock;
  env_.out.write_array(group_ + "/fp8_amax_history", {L, G, 3, H}, all.data());
  const auto& o = layers.options();
  const std::string path = group_ + "/fp8";
  env_.out.set_attr(path, "fp8_scaling", std::string(o.recipe == ops::Fp8Recipe::delayed ? "delayed" : "current"));
  env_.out.set_attr(path, "fp8_grad_format", std::string(o.grad_format == Fp8Format::e4m3 ? "e4m3" : "e5m2"));
  env_.out.set_attr(path, "fp8_fast_accum", fast_accum_name(o));
  env_.out.set_attr(path, "fp8_history", static_cast<std::int64_t>(H));
  env_.out.set_attr(path, "fp8_margin", static_cast<std::int64_t>(o.margin));
  env_.out.set_attr(path, "fp8_weight_casts",
                    std::string(trainer_.recording_model().fp8_weight_casts() ? "optimizer" : "forward"));
  env_.out.set_attr(path, "saturated_operands", static_cast<std::int64_t>(warned_.size()));
}

}  // namespace lmscale::jobs
