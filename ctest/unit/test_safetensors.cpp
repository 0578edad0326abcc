// safetensors weights files (io/safetensors_file.h, io/checkpoint.h with a .safetensors name):
// the bytes of a written file read back independently, the round trip through CheckpointReader,
// the minimal JSON parser, and every malformed header refused with an Error naming the tensor or
// key, which deck validation turns into a usage error (exit 2) naming prune.weights.
#include <gtest/gtest.h>

#include "temp_dir.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../../src/io/json_text.h"
#include "lmscale/core/error.h"
#include "lmscale/io/checkpoint.h"
#include "lmscale/io/deck.h"
#include "lmscale/io/safetensors_file.h"
#include "lmscale/io/weights_format.h"

namespace {

namespace fs = std::filesystem;
using lmscale::Error;
using lmscale::io::NamedArray;
using lmscale::io::SafetensorsReader;

using lmscale::test::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A file of header `json` (its length as the 8-byte prefix) followed by `data_bytes` zero bytes.
std::string write_raw(const std::string& path, const std::string& json, std::size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  bytes += json + std::string(data_bytes, '\0');
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(Json, ParsesTheHeaderSubset) {
  namespace json = lmscale::io::json;
  const auto v = json::parse(R"( {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                                   "__metadata__": {"k": "line\nnext \u00e9 \"q\""}, "t": true, "n": null, "z": -0} )");
  ASSERT_EQ(v.kind, json::Value::Kind::object);
  ASSERT_EQ(v.object.size(), 5u);
  EXPECT_EQ(v.object[0].first, "a");
  EXPECT_EQ(v.find("a")->find("shape")->array[1].integer, 3);
  EXPECT_EQ(v.find("__metadata__")->find("k")->string, "line\nnext \xc3\xa9 \"q\"");
  EXPECT_TRUE(v.find("t")->boolean);
  EXPECT_EQ(v.find("n")->kind, json::Value::Kind::null);
  EXPECT_EQ(json::parse(json::quote("a\"b\\c\x01")).string, "a\"b\\c\x01");   // quote and parse agree
  EXPECT_EQ(json::parse(R"("\ud83d\ude00")").string, "\xf0\x9f\x98\x80");     // a surrogate pair
  for (const char* bad : {"", "{", "{\"a\" 1}", "{\"a\": 1,}", "[1 2]", "{\"a\": 1} x", "{\"a\": 1, \"a\": 2}",
                          "1.5", "1e3", "01", "\"\\x\"", "\"\\ud83d\"", "tru", "99999999999999999999",
                          "[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]", "\"a\nb\""})
    EXPECT_THROW(json::parse(bad), Error) << bad;
}

TEST(Safetensors, FormatFollowsTheName) {
  using lmscale::io::WeightsFormat;
  EXPECT_EQ(lmscale::io::weights_format("w.safetensors"), WeightsFormat::safetensors);
  EXPECT_EQ(lmscale::io::weights_format("dir/w.safetensors.tmp"), WeightsFormat::safetensors);
  EXPECT_EQ(lmscale::io::weights_format("w.h5"), WeightsFormat::hdf5);
  EXPECT_EQ(lmscale::io::weights_format("safetensors"), WeightsFormat::hdf5);
}

TEST(Safetensors, WrittenBytesFollowTheFormat) {
  TempDir dir;
  const std::string path = dir.file("sub/w.safetensors");   // the directory is created
  const std::vector<float> a{1.0f, -2.5f, 3.0f, 4.0f, 5.0f, 6.0f}, b{7.0f};
  lmscale::io::write_weights(path, {{"layers.0.attn.q_proj.weight", {2, 3}, a.data()}, {"ln_final.weight", {1}, b.data()}},
                             {{"num_heads", std::int64_t{4}}, {"rope_theta", 10000.0}, {"config", std::string("[model]\nd_model = 32\n")}});
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const std::string bytes = slurp(path);
  ASSERT_GE(bytes.size(), 8u);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data start 8-byte aligned";
  const std::string header = bytes.substr(8, n);
  EXPECT_NE(header.find(R"("layers.0.attn.q_proj.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})"),
            std::string::npos) << header;
  EXPECT_NE(header.find(R"("ln_final.weight":{"dtype":"F32","shape":[1],"data_offsets":[24,28]})"), std::string::npos);
  EXPECT_NE(header.find(R"("num_heads":"4")"), std::string::npos) << header;
  EXPECT_NE(header.find(R"("config":"[model]\nd_model = 32\n")"), std::string::npos) << header;
  EXPECT_NE(header.find(R"("schema":"lmscale-checkpoint/1")"), std::string::npos) << header;
  ASSERT_EQ(bytes.size(), 8 + n + 28);
  float second = 0, last = 0;
  std::memcpy(&second, bytes.data() + 8 + n + 4, 4);
  std::memcpy(&last, bytes.data() + 8 + n + 24, 4);
  EXPECT_EQ(second, -2.5f);
  EXPECT_EQ(last, 7.0f);

  // Back through the reader every job uses (prune.weights, train.resume).
  const lmscale::io::CheckpointReader r(path);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"layers.0.attn.q_proj.weight", "ln_final.weight"}));
  EXPECT_FALSE(r.has_optimizer_state());
  EXPECT_EQ(r.shape("layers.0.attn.q_proj.weight"), (std::vector<std::int64_t>{2, 3}));
  std::vector<float> back(6);
  r.read("layers.0.attn.q_proj.weight", {2, 3}, back.data());
  EXPECT_EQ(back, a);
  EXPECT_THROW(r.read("layers.0.attn.q_proj.weight", {3, 2}, back.data()), Error);
  EXPECT_THROW(r.read("layers.1.attn.q_proj.weight", {2, 3}, back.data()), Error);
  EXPECT_EQ(std::get<std::string>(*r.attr("rope_theta")), "10000");
  EXPECT_FALSE(r.attr("step").has_value());
}

TEST(Safetensors, OtherDtypesReadAsFloat32) {
  TempDir dir;
  // F64 [2] = {0.5, -3}, BF16 [1] = 1.5 (0x3FC0), F16 [2] = {1.0 (0x3C00), -2.0 (0xC000)}.
  const std::string json =
      R"({"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[16,18]},)"
      R"("h":{"dtype":"F16","shape":[2],"data_offsets":[18,22]}})";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(json.size());
  bytes += json;
  const double d[2] = {0.5, -3.0};
  bytes.append(reinterpret_cast<const char*>(d), 16);
  const std::uint16_t halves[3] = {0x3FC0, 0x3C00, 0xC000};
  bytes.append(reinterpret_cast<const char*>(halves), 6);
  const std::string path = dir.file("mixed.safetensors");
  std::ofstream(path, std::ios::binary) << bytes;
  const SafetensorsReader r(path);
  float out[2] = {};
  r.read("d", {2}, out);
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], -3.0f);
  r.read("b", {1}, out);
  EXPECT_EQ(out[0], 1.5f);
  r.read("h", {2}, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
}

struct Malformed {
  std::string name, header;
  std::size_t data_bytes;
  std::string says;   // the error must contain this
};

TEST(Safetensors, MalformedFilesAreRefusedNamingWhat) {
  TempDir dir;
  const std::vector<Malformed> cases{
      {"not_json", "{\"a\": ", 0, "not valid JSON"},
      {"not_object", "[1, 2]", 0, "not a JSON object"},
      {"tensor_not_object", R"({"w": 3})", 0, "tensor \"w\": not an object"},
      {"no_dtype", R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4, "tensor \"w\": \"dtype\" missing"},
      {"unknown_dtype", R"({"w": {"dtype": "I8", "shape": [1], "data_offsets": [0, 1]}})", 1, "dtype \"I8\""},
      {"negative_dim", R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, "tensor \"w\": \"shape\""},
      {"size_mismatch", R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})", 12, "needs 16"},
      {"offsets_reversed", R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8, "\"data_offsets\""},
      {"past_the_data", R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8, "past the 8 bytes"},
      {"overlap", R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, "overlap"},
      {"metadata_not_text", R"({"__metadata__": {"step": 3}})", 0, "metadata key \"step\""},
      {"duplicate", R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
       4, "duplicate key \"w\""},
  };
  for (const auto& c : cases) {
    const std::string path = write_raw(dir.file(c.name + ".safetensors"), c.header, c.data_bytes);
    try {
      SafetensorsReader r(path);
      ADD_FAILURE() << c.name << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << c.name << ": " << e.what();
    }
  }
  // Shorter than the length prefix; a length past the end of the file.
  const std::string tiny = dir.file("tiny.safetensors");
  std::ofstream(tiny, std::ios::binary) << "abc";
  EXPECT_THROW(SafetensorsReader{tiny}, Error);
  const std::string lying = dir.file("lying.safetensors");
  std::ofstream(lying, std::ios::binary) << std::string("\xff\x00\x00\x00\x00\x00\x00\x00{}", 10);
  try {
    SafetensorsReader r(lying);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("header length 255"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, WriterRefusesBadTensorsAndOptimizerState) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const float x = 1;
  EXPECT_THROW(lmscale::io::write_weights(path, {{"a", {1}, &x}, {"a", {1}, &x}}), Error);
  EXPECT_THROW(lmscale::io::write_weights(path, {{"__metadata__", {1}, &x}}), Error);
  EXPECT_THROW(lmscale::io::write_weights(path, {{"a", {2}, nullptr}}), Error);
  lmscale::io::OptimizerArrays opt{{{"a", {1}, &x}}, {}};
  EXPECT_THROW(lmscale::io::write_weights(path, {{"a", {1}, &x}}, {}, &opt), Error);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// Deck validation reads prune.weights: a malformed safetensors file is a usage error (exit 2) that
// names the key and the problem; an existing non-safetensors file is never replaced by a
// .safetensors output.
TEST(Safetensors, DeckNamesTheKeyOfAMalformedFile) {
  TempDir dir;
  const std::string weights = write_raw(dir.file("w.safetensors"), R"({"token_embeddings.weight": {"dtype": "F32"}})", 0);
  const std::string deck = "[run]\njob = prune\noutput = " + dir.file("out.h5") +
                           "\n[model]\nvocab_size = 97\ncontext_length = 16\nd_model = 32\nd_ff = 88\nnum_layers = 2\n"
                           "num_heads = 4\n[parallel]\ndevice = cpu\n[prune]\nweights = " + weights + "\n";
  try {
    lmscale::io::parse_deck_text(deck, {}, 1);
    ADD_FAILURE() << "no error";
  } catch (const lmscale::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("prune.weights"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"shape\" missing"), std::string::npos) << e.what();
  }
  const std::string notes = dir.file("notes.safetensors");
  std::ofstream(notes) << "my notes\n";
  const float x = 1;
  lmscale::io::write_weights(dir.file("good.safetensors"), {{"a", {1}, &x}});
  try {
    lmscale::io::parse_deck_text(deck, {"--prune.weights=" + dir.file("good.safetensors"), "--prune.output=" + notes}, 1);
    ADD_FAILURE() << "no error";
  } catch (const lmscale::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("prune"), std::string::npos) << e.what();
  }
  try {
    lmscale::io::parse_deck_text(deck, {"--run.output=" + dir.file("r.safetensors")}, 1);
    ADD_FAILURE() << "no error";
  } catch (const lmscale::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("run.output"), std::string::npos) << e.what();
  }
}

}  // namespace
