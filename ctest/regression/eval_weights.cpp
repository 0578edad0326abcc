// eval_weights WEIGHTS.h5 TOKENS.i32 ROWS COLS HEADS: loads a weights file written by
// `train.save` into a float64 copy of the model and prints the mean cross-entropy of predicting
// tokens[:, 1:] from tokens[:, :-1] (TOKENS.i32: ROWS x COLS little-endian int32), in float64
// and in float32. A PyTorch model loaded from the same file (h5py -> state_dict, no renaming;
// docs/architecture.md §2) computes the same loss in float64: the two must agree.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "lmscale/io/checkpoint.h"
#include "lmscale/model/parameter_store.h"
#include "lmscale/model/transformer.h"
#include "lmscale/ops/ops.h"

using namespace lmscale;

static double loss_in(DType dt, const model::ModelDims& dims, io::CheckpointReader& r, const std::vector<std::int32_t>& tok,
                      std::int64_t rows, std::int64_t cols) {
  HostAllocator a;
  Context ctx;
  ctx.device = Device::cpu;
  ctx.allocator = &a;
  ctx.host = &a;
  model::ParameterStore ps(dims, dt, dt, a);
  std::vector<float> buf;
  for (const auto& p : ps.infos()) {
    buf.resize(static_cast<std::size_t>(p.numel));
    r.read(p.name, p.shape, buf.data());
    Tensor src = Tensor::view(buf.data(), {p.numel}, DType::f32, Device::cpu);
    Tensor dst = ps.flat_params().flat_range(p.offset, p.numel);
    ops::cast(ctx, src, dst);
  }
  model::TransformerLM m(dims, ps);
  const std::int64_t T = cols - 1;
  Tensor x = Tensor::empty({rows, T}, DType::i32, a), y = Tensor::empty({rows, T}, DType::i32, a);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t t = 0; t < T; ++t) {
      x.data_as<std::int32_t>()[i * T + t] = tok[static_cast<std::size_t>(i * cols + t)];
      y.data_as<std::int32_t>()[i * T + t] = tok[static_cast<std::size_t>(i * cols + t + 1)];
    }
  auto act = m.forward(ctx, x, y, false, 1.0);
  const double sum = dt == DType::f64 ? act->loss_sum.data_as<double>()[0] : act->loss_sum.data_as<float>()[0];
  return sum / static_cast<double>(rows * T);
}

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: eval_weights WEIGHTS.h5 TOKENS.i32 ROWS COLS HEADS\n");
    return 2;
  }
  io::CheckpointReader r(argv[1]);
  const std::int64_t rows = std::stoll(argv[3]), cols = std::stoll(argv[4]);
  std::vector<std::int32_t> tok(static_cast<std::size_t>(rows * cols));
  std::ifstream(argv[2], std::ios::binary).read(reinterpret_cast<char*>(tok.data()), static_cast<std::streamsize>(tok.size() * 4));
  model::ModelDims d;
  const auto emb = r.shape("token_embeddings.weight");
  d.vocab = emb[0];
  d.d_model = emb[1];
  d.d_ff = r.shape("layers.0.ffn.w1.weight")[0];
  d.layers = 0;
  while (r.has("layers." + std::to_string(d.layers) + ".ln1.weight")) ++d.layers;
  d.heads = std::stoll(argv[5]);
  d.context = cols - 1;
  const double l64 = loss_in(DType::f64, d, r, tok, rows, cols);
  const double l32 = loss_in(DType::f32, d, r, tok, rows, cols);
  std::printf("{\"tool\": \"lmscale eval_weights\", \"loss_fp64\": %.15g, \"loss_fp32\": %.9g}\n", l64, l32);
  return 0;
}
