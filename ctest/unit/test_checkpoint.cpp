// Weights files and training checkpoints (io/checkpoint.h): round trip of parameters, optimizer
// moments and attributes; datasets named exactly like the parameters at the root, float32 (the
// h5py -> PyTorch state_dict contract); errors naming the parameter.
#include <gtest/gtest.h>

#include "temp_dir.h"

#include <hdf5.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <variant>
#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/io/checkpoint.h"
#include "lmscale/model/parameter_store.h"

namespace {

namespace fs = std::filesystem;
using lmscale::io::AttrValue;
using lmscale::io::CheckpointReader;
using lmscale::io::NamedArray;
using lmscale::io::OptimizerArrays;
using lmscale::io::write_weights;

using lmscale::test::TempDir;

std::vector<float> ramp(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + 0.37f * static_cast<float>(i) - 1e-3f * static_cast<float>(i * i);
  return v;
}

// A tiny model's parameters in model order (docs/architecture.md §2 names), d = 4, vocab = 6, d_ff = 8.
struct TinyModel {
  std::vector<float> embedding = ramp(6 * 4, -1.f), q = ramp(4 * 4, 0.5f), ln1 = ramp(4, 1.f), w1 = ramp(8 * 4, 2.f);
  std::vector<NamedArray> params() const {
    return {{"token_embeddings.weight", {6, 4}, embedding.data()},
            {"layers.0.attn.q_proj.weight", {4, 4}, q.data()},
            {"layers.0.ln1.weight", {4}, ln1.data()},
            {"layers.0.ffn.w1.weight", {8, 4}, w1.data()}};
  }
};

TEST(Checkpoint, WeightsRoundTrip) {
  TempDir dir;
  const std::string path = dir.file("sub/weights.h5");
  const TinyModel model;
  write_weights(path, model.params(), {{"step", std::int64_t{7}}, {"config", std::string("[run]\nseed = 1\n")}});
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  const CheckpointReader reader(path);
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"token_embeddings.weight", "layers.0.attn.q_proj.weight",
                                                      "layers.0.ln1.weight", "layers.0.ffn.w1.weight"}));
  EXPECT_FALSE(reader.has_optimizer_state());
  for (const auto& p : model.params()) {
    ASSERT_TRUE(reader.has(p.name)) << p.name;
    EXPECT_EQ(reader.shape(p.name), p.shape);
    std::size_t n = 1;
    for (auto d : p.shape) n *= static_cast<std::size_t>(d);
    std::vector<float> back(n, -777.f);
    reader.read(p.name, p.shape, back.data());
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(back[i], p.data[i]) << p.name << "[" << i << "]";
  }
  EXPECT_EQ(std::get<std::int64_t>(*reader.attr("step")), 7);
  EXPECT_EQ(std::get<std::string>(*reader.attr("config")), "[run]\nseed = 1\n");
  EXPECT_EQ(std::get<std::string>(*reader.attr("schema")), "lmscale-checkpoint/1");
  EXPECT_FALSE(reader.attr("loss_scale").has_value());
  EXPECT_TRUE(reader.attrs().contains("git_commit"));
}

// What h5py sees: f["layers.0.attn.q_proj.weight"] at the root, float32, the given shape.
TEST(Checkpoint, DatasetsAreNamedLikeParametersAtTheRoot) {
  TempDir dir;
  const std::string path = dir.file("weights.h5");
  const TinyModel model;
  write_weights(path, model.params());
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  EXPECT_GT(H5Lexists(file, "layers.0.attn.q_proj.weight", H5P_DEFAULT), 0);
  const hid_t dataset = H5Dopen2(file, "layers.0.ffn.w1.weight", H5P_DEFAULT);
  ASSERT_GE(dataset, 0);
  const hid_t type = H5Dget_type(dataset);
  EXPECT_GT(H5Tequal(type, H5T_IEEE_F32LE), 0);
  const hid_t space = H5Dget_space(dataset);
  hsize_t dims[2] = {};
  EXPECT_EQ(H5Sget_simple_extent_dims(space, dims, nullptr), 2);
  EXPECT_EQ(dims[0], 8u);
  EXPECT_EQ(dims[1], 4u);
  std::vector<float> values(32);
  H5Dread(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
  EXPECT_EQ(values, model.w1);
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(dataset);
  H5Fclose(file);
}

TEST(Checkpoint, TrainingCheckpointWithOptimizerState) {
  TempDir dir;
  const std::string path = dir.file("ckpt.h5");
  const TinyModel model;
  const auto params = model.params();
  std::vector<std::vector<float>> m_data, v_data;
  OptimizerArrays optimizer;
  for (const auto& p : params) {
    std::size_t n = 1;
    for (auto d : p.shape) n *= static_cast<std::size_t>(d);
    m_data.push_back(ramp(n, 0.01f * static_cast<float>(m_data.size())));
    v_data.push_back(ramp(n, 3.f + static_cast<float>(v_data.size())));
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    optimizer.m.push_back({params[i].name, params[i].shape, m_data[i].data()});
    optimizer.v.push_back({params[i].name, params[i].shape, v_data[i].data()});
  }
  const std::map<std::string, AttrValue> attrs{{"step", std::int64_t{100}},
                                               {"seed", std::int64_t{5}},
                                               {"data_position", std::int64_t{123456}},
                                               {"loss_scale", 1024.0},
                                               {"rng", std::vector<std::int64_t>{1, 2, 3, 4}},
                                               {"lr_history", std::vector<double>{0.1, 0.2}}};
  write_weights(path, params, attrs, &optimizer);

  const CheckpointReader reader(path);
  EXPECT_TRUE(reader.has_optimizer_state());
  EXPECT_EQ(reader.names().size(), params.size());   // the optimizer group is not a parameter
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::vector<float> m(m_data[i].size()), v(v_data[i].size());
    reader.read_optimizer("m", params[i].name, params[i].shape, m.data());
    reader.read_optimizer("v", params[i].name, params[i].shape, v.data());
    EXPECT_EQ(m, m_data[i]) << params[i].name;
    EXPECT_EQ(v, v_data[i]) << params[i].name;
  }
  const auto read_attrs = reader.attrs();
  EXPECT_EQ(std::get<std::int64_t>(read_attrs.at("data_position")), 123456);
  EXPECT_EQ(std::get<double>(read_attrs.at("loss_scale")), 1024.0);
  EXPECT_EQ(std::get<std::vector<std::int64_t>>(read_attrs.at("rng")), (std::vector<std::int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(std::get<std::vector<double>>(read_attrs.at("lr_history")), (std::vector<double>{0.1, 0.2}));
}

// Further training state (write_weights' `state`: delayed FP8 scaling's histories) round-trips
// at /state/<name> with its shape, is no parameter, and a shape mismatch names both shapes.
TEST(Checkpoint, StateArraysRoundTripBesideTheParameters) {
  TempDir dir;
  const std::string path = dir.file("state.h5");
  const TinyModel model;
  const std::vector<float> history = ramp(2 * 3 * 4, 0.25f), scale = ramp(2 * 3, 8.f);
  const std::vector<NamedArray> state{{"fp8_amax_history", {2, 3, 4}, history.data()},
                                      {"fp8_scale", {2, 3}, scale.data()}};
  write_weights(path, model.params(), {}, nullptr, &state);
  const CheckpointReader reader(path);
  EXPECT_EQ(reader.names().size(), model.params().size());   // /state is not a parameter
  EXPECT_EQ(reader.state_shape("fp8_amax_history"), (std::vector<std::int64_t>{2, 3, 4}));
  EXPECT_FALSE(reader.state_shape("fp8_inv_scale").has_value());
  std::vector<float> h(history.size()), s(scale.size());
  reader.read_state("fp8_amax_history", {2, 3, 4}, h.data());
  reader.read_state("fp8_scale", {2, 3}, s.data());
  EXPECT_EQ(h, history);
  EXPECT_EQ(s, scale);
  try {
    reader.read_state("fp8_amax_history", {1, 3, 4}, h.data());
    ADD_FAILURE() << "a shape mismatch must throw";
  } catch (const lmscale::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3, 4]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[1, 3, 4]"), std::string::npos) << e.what();
  }
  const std::vector<NamedArray> bad_state{{"a/b", {1}, scale.data()}};
  EXPECT_THROW(write_weights(dir.file("bad_state.h5"), model.params(), {}, nullptr, &bad_state), lmscale::Error);
  EXPECT_FALSE(fs::exists(dir.file("bad_state.h5")));
  // "state" is reserved: no parameter may take the group's name.
  const std::vector<float> one{1.f};
  EXPECT_THROW(write_weights(dir.file("bad.h5"), {{"state", {1}, one.data()}}), lmscale::Error);
}

TEST(Checkpoint, MissingParameterAndShapeMismatchNameTheParameter) {
  TempDir dir;
  const std::string path = dir.file("weights.h5");
  const TinyModel model;
  write_weights(path, model.params());
  const CheckpointReader reader(path);
  std::vector<float> out(64);
  try {
    reader.read("layers.1.attn.q_proj.weight", {4, 4}, out.data());
    FAIL() << "no error";
  } catch (const lmscale::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'layers.1.attn.q_proj.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find("not found"), std::string::npos) << m;
  }
  try {
    reader.read("layers.0.ffn.w1.weight", {4, 8}, out.data());   // transposed
    FAIL() << "no error";
  } catch (const lmscale::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'layers.0.ffn.w1.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find("[8, 4]"), std::string::npos) << m;
    EXPECT_NE(m.find("[4, 8]"), std::string::npos) << m;
  }
  EXPECT_THROW(reader.shape("nope"), lmscale::Error);
  EXPECT_FALSE(reader.has("nope"));
  EXPECT_FALSE(reader.has("optimizer"));
  EXPECT_THROW(reader.read_optimizer("m", "layers.0.ln1.weight", {4}, out.data()), lmscale::Error);   // no state
}

TEST(Checkpoint, InvalidInputsThrowBeforeWriting) {
  TempDir dir;
  const std::string path = dir.file("bad.h5");
  const std::vector<float> x(4, 1.f);
  EXPECT_THROW(write_weights(path, {{"a/b", {4}, x.data()}}), lmscale::Error);
  EXPECT_THROW(write_weights(path, {{"", {4}, x.data()}}), lmscale::Error);
  EXPECT_THROW(write_weights(path, {{"a", {4}, x.data()}, {"a", {4}, x.data()}}), lmscale::Error);
  OptimizerArrays stray;
  stray.m.push_back({"b", {4}, x.data()});
  EXPECT_THROW(write_weights(path, {{"a", {4}, x.data()}}, {}, &stray), lmscale::Error);
  OptimizerArrays wrong_shape;
  wrong_shape.v.push_back({"a", {2, 2}, x.data()});
  EXPECT_THROW(write_weights(path, {{"a", {4}, x.data()}}, {}, &wrong_shape), lmscale::Error);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_THROW(CheckpointReader(dir.file("missing.h5")), lmscale::Error);
}

// Files hold parameters by name, so the flat layout's order is free to change: a file written in
// the reference model's order (w1, w2, w3, as the parameter store held them before w3 moved ahead
// of w2) loads into today's layout (w1, w3, w2) by name, every value at its parameter's offset --
// the loop of the trainer's weights loading (jobs/engine/checkpointing.cpp). Both file formats.
TEST(Checkpoint, FilesInTheOldParameterOrderLoadByName) {
  lmscale::model::ModelDims d;
  d.vocab = 6, d.d_model = 4, d.d_ff = 8, d.layers = 2, d.heads = 2;
  const auto layout = lmscale::model::parameter_layout(d);
  // The old order: each block's ffn.w2 moved back between w1 and w3.
  std::vector<const lmscale::model::ParamInfo*> old_order;
  for (const auto& p : layout) old_order.push_back(&p);
  for (std::size_t i = 0; i + 1 < old_order.size(); ++i)
    if (old_order[i]->name.ends_with("ffn.w3.weight")) std::swap(old_order[i], old_order[i + 1]), ++i;
  ASSERT_TRUE(old_order[7]->name == "layers.0.ffn.w2.weight" && old_order[8]->name == "layers.0.ffn.w3.weight");
  std::vector<std::vector<float>> values;
  std::vector<NamedArray> arrays;
  for (const auto* p : old_order) values.push_back(ramp(static_cast<std::size_t>(p->numel), static_cast<float>(values.size())));
  for (std::size_t i = 0; i < old_order.size(); ++i) arrays.push_back({old_order[i]->name, old_order[i]->shape, values[i].data()});
  TempDir dir;
  for (const std::string file : {"old.h5", "old.safetensors"}) {
    SCOPED_TRACE(file);
    const std::string path = dir.file(file);
    write_weights(path, arrays, {});
    const CheckpointReader r(path);
    if (file == "old.h5") EXPECT_EQ(r.names()[8], "layers.0.ffn.w3.weight");   // stored in the writer's order
    std::vector<float> flat(static_cast<std::size_t>(layout.back().offset + layout.back().numel), -99.f);
    for (const auto& p : layout) r.read(p.name, p.shape, flat.data() + p.offset);
    for (std::size_t i = 0; i < old_order.size(); ++i)
      for (std::int64_t e = 0; e < old_order[i]->numel; ++e)
        ASSERT_EQ(flat[static_cast<std::size_t>(old_order[i]->offset + e)], values[i][static_cast<std::size_t>(e)])
            << old_order[i]->name << " element " << e;
  }
}

}  // namespace
