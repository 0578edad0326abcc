// Bad decks (io/deck.h): each must throw UsageError whose message names the offending key, before
// any work. The same cases exist as files in ctest/decks/bad/ (first line `# expect: KEY`), which
// ctest/decks runs through the real executable; here every such file is also parsed directly.
#include <gtest/gtest.h>

#include <filesystem>
#include <ostream>
#include <fstream>
#include <string>
#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"

namespace {

using lmscale::UsageError;

const std::filesystem::path kRepo = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();

struct BadDeck {
  std::string name;
  std::string deck;
  std::vector<std::string> overrides;
  std::string key;        // the message must contain this
  std::string also = "";  // and this, when not empty
};

void PrintTo(const BadDeck& bad, std::ostream* os) { *os << bad.name; }

// World size 1 throughout, as for a plain `lmscale deck.ini`.
const std::vector<BadDeck> kBadDecks{
    {"unknown_key", "[model]\nd_modle = 512\n", {}, "model.d_modle", "did you mean 'model.d_model'?"},
    {"unknown_section", "[modle]\nd_model = 512\n", {}, "modle.d_model", "did you mean 'model.d_model'?"},
    {"key_outside_section", "d_model = 512\n", {}, "d_model", "model.d_model"},
    {"unknown_option", "", {"--optim.learning_rate=1"}, "optim.learning_rate"},
    {"bad_int", "[model]\nd_model = 51x2\n", {}, "model.d_model", "'51x2'"},
    {"negative_size", "[model]\nnum_layers = -2\n", {}, "model.num_layers", ">= 1"},
    {"zero_size", "[train]\nbatch_size = 0\n", {}, "train.batch_size"},
    {"bad_float", "[optim]\nlr = fast\n", {}, "optim.lr"},
    {"zero_lr", "[optim]\nlr = 0\n", {}, "optim.lr", "> 0"},
    {"beta_out_of_range", "[optim]\nbeta2 = 1.5\n", {}, "optim.beta2"},
    {"bad_enum", "[precision]\nmode = fp8\n", {}, "precision.mode", "fp32, bf16, fp16"},
    {"bad_job", "[run]\njob = pretrain\n", {}, "run.job"},
    {"bad_preset", "[model]\nsize = huge\n", {}, "model.size"},
    {"bad_bool", "[precision]\ntf32 = maybe\n", {}, "precision.tf32"},
    {"bad_list_item", "[bench]\nseq_lens = 128,abc,512\n", {}, "bench.seq_lens", "'abc'"},
    {"empty_list_item", "[bench]\nseq_lens = 128,,512\n", {}, "bench.seq_lens"},
    {"empty_list", "[bench]\nimpls =\n", {}, "bench.impls"},
    {"flash_head_dim_512", "[run]\njob = bench-attention\n[bench]\nhead_dims = 64,512\n[parallel]\ndevice = cuda\n", {},
     "bench.head_dims", "512"},
    {"model_flash_head_dim_512",
     "[run]\njob = bench-model\n[model]\nd_model = 1024\nnum_heads = 2\nattention = flash\n[parallel]\ndevice = cuda\n",
     {},
     "model.attention",
     "= 512"},
    {"min_bytes_over_max", "[bench]\nmin_bytes = 2M\nmax_bytes = 1M\n", {}, "bench.min_bytes", "bench.max_bytes"},
    {"step_factor_1", "[bench]\nstep_factor = 1\n", {}, "bench.step_factor"},
    {"bad_bytes", "[bench]\nmax_bytes = 1T\n", {}, "bench.max_bytes"},
    {"heads_not_dividing", "[model]\nd_model = 512\nnum_heads = 12\n", {}, "model.num_heads", "model.d_model"},
    {"odd_head_dim", "[model]\nd_model = 96\nnum_heads = 32\n", {}, "model.num_heads", "RoPE"},
    {"dp_tp_pp_not_world", "[parallel]\ndp = 2\n", {}, "parallel.dp", "world size is 1"},
    {"tp_pp_not_dividing_world", "[parallel]\npp = 2\n[model]\nnum_layers = 4\n", {}, "parallel.pp"},
    {"heads_tp", "[model]\nd_model = 512\nnum_heads = 16\n[parallel]\ntp = 3\n", {}, "parallel.tp", "model.num_heads"},
    {"pp_over_layers", "[model]\nnum_layers = 2\n[parallel]\npp = 3\n", {}, "parallel.pp", "model.num_layers"},
    {"batch_dp", "[train]\nbatch_size = 3\n[parallel]\ndp = 2\n", {}, "train.batch_size", "parallel.dp"},
    {"bench_batch_dp", "[run]\njob = bench-model\n[bench]\nbatch_size = 3\n[parallel]\ndp = 2\n", {}, "bench.batch_size"},
    {"grad_accum", "[train]\nbatch_size = 8\ngrad_accum = 3\n", {}, "train.grad_accum"},
    {"microbatches",
     "[model]\nnum_layers = 4\n[parallel]\ndp = 1\npp = 2\nmicrobatches = 3\n[train]\nbatch_size = 8\n",
     {},
     "parallel.microbatches"},
    {"bf16_on_cpu", "[precision]\nmode = bf16\n[parallel]\ndevice = cpu\n", {}, "precision.mode", "parallel.device"},
    {"nccl_on_cpu", "[parallel]\ndevice = cpu\nbackend = nccl\n", {}, "parallel.backend"},
    {"tokens_without_path", "[data]\nsource = tokens\n", {}, "data.path"},
    {"tokens_missing_file", "[data]\nsource = tokens\npath = /nonexistent/tokens.bin\n", {}, "data.path"},
    {"resume_missing_file", "[train]\nresume = /nonexistent/ckpt.h5\n", {}, "train.resume"},
    {"warmup_over_steps", "[train]\nsteps = 100\n[optim]\nwarmup_steps = 200\n", {}, "optim.warmup_steps", "train.steps"},
    {"min_lr_over_lr", "[optim]\nlr = 1e-4\nmin_lr = 1e-3\n", {}, "optim.min_lr"},
    {"save_is_output", "[run]\noutput = a.h5\n[train]\nsave = a.h5\n", {}, "train.save"},
    {"duplicate_key", "[model]\nd_model = 256\nd_model = 512\n", {}, "model.d_model"},
    {"bad_override_value", "", {"--train.steps=many"}, "train.steps", "on the command line"},
    {"duplicate_override", "", {"--model.d_model=256", "--model.d_model=512"}, "model.d_model", "more than once"},
};

class BadDeckTest : public ::testing::TestWithParam<BadDeck> {};

TEST_P(BadDeckTest, ThrowsUsageErrorNamingTheKey) {
  const BadDeck& bad = GetParam();
  try {
    lmscale::io::parse_deck_text(bad.deck, bad.overrides, 1);
    FAIL() << bad.name << ": no error";
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(bad.key), std::string::npos) << bad.name << ": " << message;
    if (!bad.also.empty()) {
      EXPECT_NE(message.find(bad.also), std::string::npos) << bad.name << ": " << message;
    }
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Decks, BadDeckTest, ::testing::ValuesIn(kBadDecks),
                         [](const ::testing::TestParamInfo<BadDeck>& param_info) { return param_info.param.name; });

TEST(BadDeckTable, HasAtLeastTwentyCases) { EXPECT_GE(kBadDecks.size(), 20u); }

// The files the executable is tested with (ctest/decks): each throws naming its `# expect:` key.
TEST(BadDeckFiles, EachThrowsNamingItsExpectedKey) {
  const auto dir = kRepo / "ctest" / "decks" / "bad";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".ini") continue;
    ++files;
    std::ifstream in(entry.path());
    std::string first;
    std::getline(in, first);
    const std::string tag = "# expect: ";
    ASSERT_EQ(first.rfind(tag, 0), 0u) << entry.path() << " must start with '# expect: KEY'";
    const std::string key = first.substr(tag.size());
    const std::string path = entry.path().string();
    const char* argv[] = {"lmscale", path.c_str(), "--run.output=/nonexistent/out.h5"};
    try {
      lmscale::io::parse_invocation(3, argv, 1);
      ADD_FAILURE() << path << ": no error";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << path << ": " << e.what();
    }
  }
  EXPECT_GE(files, 20);
}

}  // namespace
