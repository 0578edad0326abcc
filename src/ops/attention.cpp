// ops::attention_* : argument checks, then dispatch on device and dtype to ops/cpu (float,
// double) or ops/cuda (fp32, bf16, fp16). AttentionShape's helpers live here too.
#include <cmath>
#include <initializer_list>
#include <utility>

#include "cpu/attention_cpu.h"
#include "lmscale/core/error.h"
#include "lmscale/ops/ops.h"

#ifdef LMSCALE_WITH_CUDA
#include "cuda/attention_cuda.h"
#endif

namespace lmscale::ops {

AttentionShape AttentionShape::bthd(std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t Dh, bool causal) {
  AttentionShape s;
  s.batch = B, s.heads = H, s.seq = T, s.head_dim = Dh, s.causal = causal;
  s.stride_b = T * H * Dh, s.stride_h = Dh, s.stride_t = H * Dh;
  s.o_stride_b = s.stride_b, s.o_stride_h = s.stride_h, s.o_stride_t = s.stride_t;
  return s;
}

AttentionShape AttentionShape::bhtd(std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t Dh, bool causal) {
  AttentionShape s;
  s.batch = B, s.heads = H, s.seq = T, s.head_dim = Dh, s.causal = causal;
  s.stride_b = H * T * Dh, s.stride_h = T * Dh, s.stride_t = Dh;
  s.o_stride_b = s.stride_b, s.o_stride_h = s.stride_h, s.o_stride_t = s.stride_t;
  return s;
}

AttentionShape& AttentionShape::with_qkv_row_stride(std::int64_t row_stride) {
  LMSCALE_CHECK(stride_h == head_dim && stride_t == heads * head_dim && stride_b == seq * stride_t,
                "AttentionShape::with_qkv_row_stride: the shape must be [B, T, H, Dh] (bthd)");
  LMSCALE_CHECK(row_stride >= heads * head_dim, "AttentionShape::with_qkv_row_stride: row stride {} below H*Dh = {}",
                row_stride, heads * head_dim);
  stride_t = row_stride;
  stride_b = seq * row_stride;
  return *this;
}

double AttentionShape::softmax_scale() const { return scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim)); }

namespace {

// Which stride set a tensor follows: q, k, v and their gradients, or o and dO.
enum class Layout { qkv, o };

// Every tensor of the strided layout must hold the element with the largest offset.
void check_strided(const char* op, const char* name, const AttentionShape& s, Layout layout, const Tensor& t,
                   DType dtype, Device dev) {
  LMSCALE_CHECK(t.defined(), "{}: '{}' has no data", op, name);
  LMSCALE_CHECK(t.dtype() == dtype, "{}: '{}' is {}, expected {}", op, name, dtype_name(t.dtype()), dtype_name(dtype));
  LMSCALE_CHECK(t.device() == dev, "{}: '{}' is on {}, expected {}", op, name, device_name(t.device()),
                device_name(dev));
  const bool o = layout == Layout::o;
  const std::int64_t last = (s.batch - 1) * (o ? s.o_stride_b : s.stride_b) +
                            (s.heads - 1) * (o ? s.o_stride_h : s.stride_h) +
                            (s.seq - 1) * (o ? s.o_stride_t : s.stride_t) + s.head_dim - 1;
  LMSCALE_CHECK(t.numel() > last, "{}: '{}' has {} elements; the layout needs {}", op, name, t.numel(), last + 1);
}

void check_shape(const char* op, const AttentionShape& s) {
  LMSCALE_CHECK(s.batch >= 1 && s.heads >= 1 && s.seq >= 1 && s.head_dim >= 1, "{}: empty shape B={} H={} T={} D={}",
                op, s.batch, s.heads, s.seq, s.head_dim);
  LMSCALE_CHECK(s.stride_t >= s.head_dim && s.stride_b >= 0 && s.stride_h >= 0,
                "{}: bad q/k/v strides (b {}, h {}, t {}) for head_dim {}", op, s.stride_b, s.stride_h, s.stride_t,
                s.head_dim);
  LMSCALE_CHECK(s.o_stride_t >= s.head_dim && s.o_stride_b >= 0 && s.o_stride_h >= 0,
                "{}: bad o/dO strides (b {}, h {}, t {}) for head_dim {}", op, s.o_stride_b, s.o_stride_h,
                s.o_stride_t, s.head_dim);
}

void check_aux(const char* op, const char* name, const Tensor& t, DType dtype, Device dev, std::int64_t numel) {
  LMSCALE_CHECK(t.defined() && t.dtype() == dtype && t.device() == dev && t.numel() == numel,
                "{}: '{}' must be {} on {} with {} elements (got {} on {} with {})", op, name, dtype_name(dtype),
                device_name(dev), numel, dtype_name(t.dtype()), device_name(t.device()), t.numel());
}

// The dtype of lse for inputs of dtype `d`: fp64 for fp64, else fp32.
DType lse_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

void check_input_dtype(const char* op, Device dev, DType d) {
  if (dev == Device::cpu)
    LMSCALE_CHECK(d == DType::f32 || d == DType::f64, "{}: CPU attention takes fp32 or fp64, not {}", op, dtype_name(d));
  else
    LMSCALE_CHECK(d == DType::f32 || d == DType::bf16 || d == DType::f16, "{}: CUDA attention takes fp32, bf16 or fp16, not {}",
                  op, dtype_name(d));
}

#ifndef LMSCALE_WITH_CUDA
[[noreturn]] void no_cuda(const char* op) {
  throw Error(fmt::format("{}: tensors are on cuda but this lmscale was built without CUDA", op));
}
#endif

struct Operand {
  const char* name;
  const Tensor* t;
  Layout layout;
};

// The checks every attention entry point starts with: the shape, one dtype and device for all
// strided operands (those of q), and each operand's extent in its layout. Returns the device.
Device check_operands(const char* op, const AttentionShape& s, std::initializer_list<Operand> ts) {
  check_shape(op, s);
  const Tensor& q = *ts.begin()->t;
  const Device dev = q.device();
  check_input_dtype(op, dev, q.dtype());
  for (const Operand& x : ts) check_strided(op, x.name, s, x.layout, *x.t, q.dtype(), dev);
  return dev;
}

constexpr Layout kQkv = Layout::qkv, kO = Layout::o;

}  // namespace

void attention_naive(Context& ctx, const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                     Tensor& o, Tensor& probs) {
  const char* op = "attention_naive";
  const DType dt = q.dtype();
  const Device dev = check_operands(op, s, {{"q", &q, kQkv}, {"k", &k, kQkv}, {"v", &v, kQkv}, {"o", &o, kO}});
  check_aux(op, "probs", probs, dt, dev, s.batch * s.heads * s.seq * s.seq);
  if (dev == Device::cpu) {
    if (dt == DType::f32)
      cpu::attention_naive_forward(s, q.data_as<float>(), k.data_as<float>(), v.data_as<float>(), o.data_as<float>(),
                                   probs.data_as<float>());
    else
      cpu::attention_naive_forward(s, q.data_as<double>(), k.data_as<double>(), v.data_as<double>(),
                                   o.data_as<double>(), probs.data_as<double>());
    return;
  }
#ifdef LMSCALE_WITH_CUDA
  cuda::attention_naive_forward(ctx, s, dt, q.data(), k.data(), v.data(), o.data(), probs.data());
#else
  (void)ctx;
  no_cuda(op);
#endif
}

void attention_naive_backward(Context& ctx, const AttentionShape& s, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& probs, const Tensor& dout, Tensor& dq, Tensor& dk,
                              Tensor& dv) {
  const char* op = "attention_naive_backward";
  const DType dt = q.dtype();
  const Device dev = check_operands(op, s, {{"q", &q, kQkv}, {"k", &k, kQkv}, {"v", &v, kQkv}, {"dout", &dout, kO},
                                               {"dq", &dq, kQkv}, {"dk", &dk, kQkv}, {"dv", &dv, kQkv}});
  check_aux(op, "probs", probs, dt, dev, s.batch * s.heads * s.seq * s.seq);
  if (dev == Device::cpu) {
    if (dt == DType::f32)
      cpu::attention_naive_backward(s, q.data_as<float>(), k.data_as<float>(), v.data_as<float>(),
                                    probs.data_as<float>(), dout.data_as<float>(), dq.data_as<float>(),
                                    dk.data_as<float>(), dv.data_as<float>());
    else
      cpu::attention_naive_backward(s, q.data_as<double>(), k.data_as<double>(), v.data_as<double>(),
                                    probs.data_as<double>(), dout.data_as<double>(), dq.data_as<double>(),
                                    dk.data_as<double>(), dv.data_as<double>());
    return;
  }
#ifdef LMSCALE_WITH_CUDA
  cuda::attention_naive_backward(ctx, s, dt, q.data(), k.data(), v.data(), probs.data(), dout.data(), dq.data(),
                                 dk.data(), dv.data());
#else
  (void)ctx;
  no_cuda(op);
#endif
}

void attention_flash(Context& ctx, const AttentionShape& s, const Tensor& q, const Tensor& k, const Tensor& v,
                     Tensor& o, Tensor& lse) {
  const char* op = "attention_flash";
  const DType dt = q.dtype();
  const Device dev = check_operands(op, s, {{"q", &q, kQkv}, {"k", &k, kQkv}, {"v", &v, kQkv}, {"o", &o, kO}});
  check_aux(op, "lse", lse, lse_dtype(dt), dev, s.batch * s.heads * s.seq);
  if (dev == Device::cpu) {
    if (dt == DType::f32)
      cpu::attention_flash_forward(s, q.data_as<float>(), k.data_as<float>(), v.data_as<float>(), o.data_as<float>(),
                                   lse.data_as<float>());
    else
      cpu::attention_flash_forward(s, q.data_as<double>(), k.data_as<double>(), v.data_as<double>(),
                                   o.data_as<double>(), lse.data_as<double>());
    return;
  }
#ifdef LMSCALE_WITH_CUDA
  cuda::attention_flash_forward(ctx, s, dt, q.data(), k.data(), v.data(), o.data(), lse.data_as<float>());
#else
  (void)ctx;
  no_cuda(op);
#endif
}

void attention_flash_backward(Context& ctx, const AttentionShape& s, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq,
                              Tensor& dk, Tensor& dv) {
  const char* op = "attention_flash_backward";
  const DType dt = q.dtype();
  const Device dev = check_operands(op, s, {{"q", &q, kQkv}, {"k", &k, kQkv}, {"v", &v, kQkv}, {"o", &o, kO},
                                               {"dout", &dout, kO}, {"dq", &dq, kQkv}, {"dk", &dk, kQkv},
                                               {"dv", &dv, kQkv}});
  check_aux(op, "lse", lse, lse_dtype(dt), dev, s.batch * s.heads * s.seq);
  if (dev == Device::cpu) {
    if (dt == DType::f32)
      cpu::attention_flash_backward(s, q.data_as<float>(), k.data_as<float>(), v.data_as<float>(), o.data_as<float>(),
                                    lse.data_as<float>(), dout.data_as<float>(), dq.data_as<float>(),
                                    dk.data_as<float>(), dv.data_as<float>());
    else
      cpu::attention_flash_backward(s, q.data_as<double>(), k.data_as<double>(), v.data_as<double>(),
                                    o.data_as<double>(), lse.data_as<double>(), dout.data_as<double>(),
                                    dq.data_as<double>(), dk.data_as<double>(), dv.data_as<double>());
    return;
  }
#ifdef LMSCALE_WITH_CUDA
  cuda::attention_flash_backward(ctx, s, dt, q.data(), k.data(), v.data(), o.data(), lse.data_as<float>(), dout.data(),
                                 dq.data(), dk.data(), dv.data());
#else
  (void)ctx;
  no_cuda(op);
#endif
}

}  // namespace lmscale::ops
