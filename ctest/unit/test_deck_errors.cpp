// Bad decks (io/deck.h): each must throw UsageError whose message names the offending key, before
// any work. The same cases exist as files in ctest/decks/bad/ (first line `# expect: KEY`), which
// ctest/decks runs through the real executable; here every such file is also parsed directly.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <ostream>
#include <fstream>
#include <string>
#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"

namespace {

using lmscale::UsageError;

const std::filesystem::path kRepo = LMSCALE_SOURCE_DIR;   // (not __FILE__: ccache base_dir makes it relative)

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
    {"bad_enum", "[precision]\nmode = fp4\n", {}, "precision.mode", "fp32, bf16, fp16, fp8"},
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
    {"copy_engine_without_zero2", "[parallel]\ngrad_exchange = copy-engine\nzero = zero1\n", {},
     "parallel.grad_exchange", "parallel.zero = zero2"},
    {"copy_engine_with_flat_ddp", "[parallel]\ngrad_exchange = copy-engine\nzero = none\nddp = flat\n", {},
     "parallel.grad_exchange", "parallel.ddp = flat"},
    {"copy_engine_on_cpu", "[parallel]\ngrad_exchange = copy-engine\nzero = zero2\ndevice = cpu\n", {},
     "parallel.grad_exchange", "parallel.device = cpu"},
    {"copy_engine_bf16_reduce",
     "[parallel]\ngrad_exchange = copy-engine\nzero = zero2\ndevice = cuda\ngrad_reduce_dtype = bf16\n", {},
     "parallel.grad_exchange", "parallel.grad_reduce_dtype"},
    {"copy_engine_with_pp",
     "[model]\nnum_layers = 4\n[parallel]\ngrad_exchange = copy-engine\nzero = zero2\ndevice = cuda\npp = 2\n", {},
     "parallel.grad_exchange", "parallel.pp = 2"},
    {"tokens_without_path", "[data]\nsource = tokens\n", {}, "data.path"},
    {"tokens_missing_file", "[data]\nsource = tokens\npath = /nonexistent/tokens.bin\n", {}, "data.path"},
    {"resume_missing_file", "[train]\nresume = /nonexistent/ckpt.h5\n", {}, "train.resume"},
    {"warmup_over_steps", "[train]\nsteps = 100\n[optim]\nwarmup_steps = 200\n", {}, "optim.warmup_steps", "train.steps"},
    {"min_lr_over_lr", "[optim]\nlr = 1e-4\nmin_lr = 1e-3\n", {}, "optim.min_lr"},
    {"save_is_output", "[run]\noutput = a.h5\n[train]\nsave = a.h5\n", {}, "train.save"},
    {"duplicate_key", "[model]\nd_model = 256\nd_model = 512\n", {}, "model.d_model"},
    {"bad_override_value", "", {"--train.steps=many"}, "train.steps", "on the command line"},
    {"duplicate_override", "", {"--model.d_model=256", "--model.d_model=512"}, "model.d_model", "more than once"},
    // Mixture of experts (io/deck_moe.cpp).
    {"moe_top_k_over_experts", "[model]\nmoe_experts = 4\nmoe_top_k = 5\n", {}, "model.moe_top_k", "model.moe_experts = 4"},
    {"moe_expert_gemm_unknown", "[model]\nmoe_experts = 4\nmoe_expert_gemm = batched\n", {}, "model.moe_expert_gemm",
     "grouped"},
    {"moe_every_zero", "[model]\nmoe_experts = 4\nmoe_every = 0\n", {}, "model.moe_every", ">= 1"},
    {"moe_every_over_layers", "[model]\nnum_layers = 2\nmoe_experts = 4\nmoe_every = 3\n", {}, "model.moe_every"},
    {"moe_negative_capacity", "[model]\nmoe_experts = 4\nmoe_capacity_factor = -1\n", {}, "model.moe_capacity_factor"},
    {"ep_with_copy_engine", "[model]\nmoe_experts = 4\n[parallel]\ndevice = cuda\ndp = 2\nep = 2\nzero = zero2\n"
     "grad_exchange = copy-engine\n[train]\nbatch_size = 4\n", {}, "parallel.grad_exchange", "parallel.ep = 2"},
    // parallel.ep_exchange = copy-engine: ep > 1 on CUDA over NCCL only.
    {"ep_exchange_without_ep", "[model]\nmoe_experts = 4\n[parallel]\ndevice = cuda\nep_exchange = copy-engine\n", {},
     "parallel.ep_exchange", "parallel.ep = 1"},
    {"ep_exchange_dense", "[parallel]\ndevice = cuda\nep_exchange = copy-engine\n", {}, "parallel.ep_exchange",
     "parallel.ep > 1"},
    {"ep_exchange_on_cpu", "[model]\nmoe_experts = 4\n[parallel]\ndevice = cpu\ndp = 2\nep = 2\n"
     "ep_exchange = copy-engine\n[train]\nbatch_size = 4\n", {}, "parallel.ep_exchange", "parallel.device = cpu"},
    {"ep_exchange_over_mpi", "[model]\nmoe_experts = 4\n[parallel]\ndevice = cuda\nbackend = mpi\ndp = 2\nep = 2\n"
     "ep_exchange = copy-engine\n[train]\nbatch_size = 4\n", {}, "parallel.ep_exchange", "parallel.backend = mpi"},
    {"ep_exchange_unknown", "[parallel]\nep_exchange = nvlink\n", {}, "parallel.ep_exchange", "copy-engine"},
    // parallel.ep_rebalance_every: relabels experts over ep > 1 ranks; bench-model in its warm-up.
    {"ep_rebalance_without_ep", "[model]\nmoe_experts = 4\n[parallel]\ndevice = cpu\nep_rebalance_every = 10\n", {},
     "parallel.ep_rebalance_every", "parallel.ep = 1"},
    {"ep_rebalance_after_warmup", "[run]\njob = bench-model\n[model]\nmoe_experts = 4\n[parallel]\ndevice = cpu\n"
     "dp = 2\nep = 2\nep_rebalance_every = 6\n[bench]\nwarmup = 5\nbatch_size = 4\n", {},
     "parallel.ep_rebalance_every", "bench.warmup = 5"},
    {"ep_rebalance_negative", "[parallel]\nep_rebalance_every = -1\n", {}, "parallel.ep_rebalance_every"},
    {"ep_without_experts", "[parallel]\nep = 2\n", {}, "parallel.ep", "model.moe_experts = 0"},
    {"ep_not_dividing_experts", "[model]\nmoe_experts = 6\n[parallel]\ndevice = cpu\nep = 4\n", {}, "parallel.ep",
     "model.moe_experts = 6"},
    {"ep_not_dividing_dp", "[model]\nmoe_experts = 4\n[parallel]\ndevice = cpu\nep = 2\n", {}, "parallel.ep",
     "parallel.dp = 1"},
    {"ep_with_lamb", "[model]\nmoe_experts = 4\n[parallel]\ndevice = cpu\nep = 2\ndp = 2\n[train]\nbatch_size = 4\n"
     "[optim]\nname = lamb\n", {}, "parallel.ep", "layer-wise optimizer"},
    {"ep_with_offload", "[model]\nmoe_experts = 4\n[parallel]\ndevice = cpu\nep = 2\ndp = 2\nzero = zero1\noffload = "
     "optimizer\n[train]\nbatch_size = 4\n", {}, "parallel.ep", "parallel.offload"},
    // The one-step-delayed offload update (io/deck_validate.cpp, check_offload).
    {"delayed_update_without_params_offload", "[parallel]\ndevice = cpu\nzero = fsdp\noffload = optimizer\n"
     "offload_delayed_update = true\n[train]\nbatch_size = 4\n", {}, "parallel.offload_delayed_update",
     "parallel.offload = optimizer"},
    {"delayed_update_without_offload", "[parallel]\noffload_delayed_update = true\n", {},
     "parallel.offload_delayed_update", "optimizer+params"},
    {"moe_with_tp", "[model]\nmoe_experts = 4\n[parallel]\ndevice = cpu\ntp = 2\n", {"--parallel.dp=1"},
     "parallel.tp", "tensor parallelism of MoE blocks"},
    {"moe_with_selective", "[model]\nmoe_experts = 4\n[parallel]\ndevice = cpu\n[train]\nactivation_checkpointing = "
     "selective\n", {}, "train.activation_checkpointing", "model.moe_experts"},
    // fsdp composes with expert parallelism (DeckExpertParallel below); its host optimizer does not.
    {"moe_ep_fsdp_with_offload", "[model]\nmoe_experts = 4\n[parallel]\ndevice = cpu\nzero = fsdp\nep = 2\n"
     "offload = optimizer\n[train]\nbatch_size = 4\n", {"--parallel.dp=4"}, "parallel.ep", "parallel.offload"},
    // train.cuda_graphs (io/deck_cuda_graphs.cpp): one process on one GPU, the modes it can capture.
    {"cuda_graphs_cpu", "[train]\ncuda_graphs = true\n[parallel]\ndevice = cpu\n", {}, "train.cuda_graphs",
     "parallel.device = cpu"},
    {"cuda_graphs_tp", "[run]\njob = bench-model\n[train]\ncuda_graphs = true\n[parallel]\ndevice = cuda\ntp = 2\n", {},
     "train.cuda_graphs", "parallel.tp = 2"},
    {"cuda_graphs_pp", "[train]\ncuda_graphs = true\n[parallel]\ndevice = cuda\npp = 2\n", {}, "train.cuda_graphs",
     "parallel.pp = 2"},
    {"cuda_graphs_offload", "[train]\ncuda_graphs = true\n[parallel]\ndevice = cuda\noffload = optimizer\n", {},
     "train.cuda_graphs", "parallel.offload = optimizer"},
    {"cuda_graphs_overlap", "[train]\ncuda_graphs = true\n[parallel]\ndevice = cuda\noverlap_optimizer = true\n", {},
     "train.cuda_graphs", "parallel.overlap_optimizer"},
    {"cuda_graphs_moe", "[train]\ncuda_graphs = true\n[parallel]\ndevice = cuda\n[model]\nmoe_experts = 4\n", {},
     "train.cuda_graphs", "model.moe_experts"},
    {"fsdp_gather_fp8_without_fsdp", "[precision]\nmode = fp8\n[parallel]\nfsdp_gather_dtype = fp8\n", {},
     "parallel.fsdp_gather_dtype", "set parallel.zero = fsdp"},
    {"fsdp_gather_fp8_without_fp8", "[parallel]\nzero = fsdp\nfsdp_gather_dtype = fp8\n", {},
     "parallel.fsdp_gather_dtype", "set precision.mode = fp8"},
    {"fp8_fast_accum_bad_value", "[precision]\nmode = fp8\nfp8_fast_accum = fast\n", {}, "precision.fp8_fast_accum",
     "none, forward, all"},
    {"fp8_fast_accum_without_fp8", "[precision]\nmode = bf16\nfp8_fast_accum = all\n", {},
     "precision.fp8_fast_accum", "set precision.mode = fp8"},
    {"fp8_weight_casts_bad_value", "[precision]\nmode = fp8\nfp8_weight_casts = step\n", {},
     "precision.fp8_weight_casts", "optimizer, forward"},
    {"fp8_weight_casts_without_fp8", "[precision]\nmode = bf16\nfp8_weight_casts = forward\n", {},
     "precision.fp8_weight_casts", "set precision.mode = fp8"},
    {"fsdp_gather_fp8_delayed",
     "[precision]\nmode = fp8\nfp8_scaling = delayed\n[parallel]\nzero = fsdp\nfsdp_gather_dtype = fp8\n", {},
     "parallel.fsdp_gather_dtype", "set precision.fp8_scaling = current"},
    {"cuda_graphs_sgd", "[train]\ncuda_graphs = true\n[parallel]\ndevice = cuda\n[optim]\nname = sgd\n", {},
     "train.cuda_graphs", "optim.name = sgd"},
    {"cuda_graphs_bench_forward",
     "[run]\njob = bench-model\n[bench]\nmode = forward\n[train]\ncuda_graphs = true\n[parallel]\ndevice = cuda\n", {},
     "train.cuda_graphs", "bench.mode = forward"},
    {"cuda_graphs_prune", "[run]\njob = prune\n[train]\ncuda_graphs = true\n[parallel]\ndevice = cuda\n", {},
     "train.cuda_graphs", "run.job = prune"},
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

// ---- files a deck names (issue 22): output targets, token files, checkpoints -----------------

class Files {
 public:
  Files() {
    dir_ = std::filesystem::temp_directory_path() /
           ("lmscale_deck_files_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~Files() { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    return path(name);
  }
  // n uint16 token ids, id i = i % 64 (all below the vocabulary of 64 used here).
  std::string tokens(const std::string& name, std::size_t n) const {
    std::string bytes(2 * n, '\0');
    for (std::size_t i = 0; i < n; ++i) bytes[2 * i] = static_cast<char>(i % 64);
    return write(name, bytes);
  }
  std::string fifo(const std::string& name) const {
    EXPECT_EQ(::mkfifo(path(name).c_str(), 0644), 0);
    return path(name);
  }

 private:
  std::filesystem::path dir_;
};

// The message of the UsageError that parsing throws ("" when none).
std::string deck_error(const std::string& deck, const std::vector<std::string>& overrides, int world = 1) {
  try {
    lmscale::io::parse_deck_text(deck, overrides, world);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

const std::string kTinyTrain =
    "[run]\njob = train\n[model]\nvocab_size = 64\ncontext_length = 8\nd_model = 16\nd_ff = 32\nnum_layers = 1\n"
    "num_heads = 2\n[parallel]\ndevice = cpu\n";

TEST(DeckFiles, OutputTargetsThatAreNotOursAreRefused) {
  Files f;
  std::filesystem::create_directories(f.path("dir.h5"));
  f.write("notes.h5", "my notes\n");
  f.write("blocker", "a file");
  const std::string fifo = f.fifo("fifo.h5");
  f.fifo("busy.h5.tmp");
  const struct {
    std::vector<std::string> overrides;
    std::string key, also;
  } cases[] = {
      {{"--run.output=" + fifo}, "run.output", "FIFO"},
      {{"--run.output=/dev/null"}, "run.output", "character device"},
      {{"--run.output=" + f.path("dir.h5")}, "run.output", "directory"},
      {{"--run.output=" + f.path("notes.h5")}, "run.output", "not an HDF5 file"},
      {{"--run.output=" + f.path("blocker/sub/out.h5")}, "run.output", "not a directory"},
      {{"--run.output=" + f.path("busy.h5")}, "run.output", "busy.h5.tmp"},
      {{"--run.output=" + f.path("out/")}, "run.output", "directory"},
      {{"--run.output=" + f.path("o.h5"), "--train.save=" + fifo}, "train.save", "FIFO"},
      {{"--run.output=" + f.path("o.h5"), "--train.checkpoint_every=1", "--train.checkpoint_path=" + fifo},
       "train.checkpoint_path", "FIFO"},
  };
  for (const auto& c : cases) {
    const std::string message = deck_error(kTinyTrain, c.overrides);
    EXPECT_NE(message.find(c.key + " = '"), std::string::npos) << c.overrides.back() << ": " << message;
    EXPECT_NE(message.find(c.also), std::string::npos) << c.overrides.back() << ": " << message;
  }
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));   // validation touches nothing
  EXPECT_FALSE(std::filesystem::exists(f.path("blocker/sub")));
  // What may be written: a new name (in directories still to be made), an HDF5 file, an empty file.
  f.write("empty.h5", "");
  f.write("previous.h5", std::string("\x89HDF\r\n\x1a\n", 8) + std::string(100, '\0'));
  for (const std::string& ok : {f.path("new/dirs/out.h5"), f.path("previous.h5"), f.path("empty.h5")})
    EXPECT_EQ(deck_error(kTinyTrain, {"--run.output=" + ok}), "") << ok;
  // train.save of a bench job is not written, so not checked.
  EXPECT_EQ(deck_error(kTinyTrain, {"--run.output=" + f.path("o.h5"), "--run.job=bench-model", "--train.save=" + fifo}),
            "");
}

TEST(DeckFiles, TokenFilesAreCheckedBeforeAnyWork) {
  Files f;
  const std::string good = f.tokens("good.bin", 100);
  const std::string out = "--run.output=" + f.path("o.h5");
  auto tokens = [&](const std::string& path) {
    return std::vector<std::string>{out, "--data.source=tokens", "--data.path=" + path};
  };
  EXPECT_EQ(deck_error(kTinyTrain, tokens(good)), "");

  const std::string short_file = f.tokens("short.bin", 9);   // context 8 needs 10
  std::string message = deck_error(kTinyTrain, tokens(short_file));
  EXPECT_NE(message.find("data.path"), std::string::npos) << message;
  EXPECT_NE(message.find("holds 9 tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("model.context_length"), std::string::npos) << message;

  const std::string odd = f.write("odd.bin", std::string(201, '\0'));
  message = deck_error(kTinyTrain, tokens(odd));
  EXPECT_NE(message.find("data.path"), std::string::npos) << message;
  EXPECT_NE(message.find("201 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("data.dtype"), std::string::npos) << message;
  // 202 bytes are 101 uint16 tokens but no whole number of uint32 ones.
  const std::string even = f.write("even.bin", std::string(202, '\0'));
  EXPECT_EQ(deck_error(kTinyTrain, tokens(even)), "");
  message = deck_error(kTinyTrain, {out, "--data.source=tokens", "--data.path=" + even, "--data.dtype=uint32"});
  EXPECT_NE(message.find("data.dtype = uint32 tokens (4 bytes each)"), std::string::npos) << message;

  std::string bytes(200, '\0');
  bytes[2 * 77] = 64;   // id 64 at position 77, vocabulary 64
  bytes[2 * 90] = static_cast<char>(0xff);   // and 255 later
  const std::string bad = f.write("bad.bin", bytes);
  message = deck_error(kTinyTrain, tokens(bad));
  EXPECT_NE(message.find("data.path"), std::string::npos) << message;
  EXPECT_NE(message.find("token 64 at position 77"), std::string::npos) << message;
  EXPECT_NE(message.find("largest id in the file is 255"), std::string::npos) << message;
  EXPECT_NE(message.find("model.vocab_size"), std::string::npos) << message;
  EXPECT_EQ(deck_error(kTinyTrain, {out, "--data.source=tokens", "--data.path=" + bad, "--model.vocab_size=256"}), "");

  auto with_val = tokens(good);
  with_val.push_back("--data.val_path=" + bad);
  message = deck_error(kTinyTrain, with_val);
  EXPECT_NE(message.find("data.val_path"), std::string::npos) << message;
}

TEST(DeckFiles, CheckpointsAreCheckedBeforeAnyWork) {
  Files f;
  const std::string out = "--run.output=" + f.path("o.h5");
  std::string message = deck_error(kTinyTrain, {out, "--train.resume=" + f.write("ck.h5", "not a checkpoint")});
  EXPECT_NE(message.find("train.resume"), std::string::npos) << message;
  EXPECT_NE(message.find("not a readable lmscale checkpoint"), std::string::npos) << message;
  // A sharded optimizer writes sharded checkpoints only: checkpoint_every without checkpoint_dir
  // is refused before the run, not after it.
  message = deck_error(kTinyTrain + "[train]\nbatch_size = 2\n",
                       {out, "--parallel.zero=zero1", "--train.checkpoint_every=5"}, 2);
  EXPECT_NE(message.find("train.checkpoint_every"), std::string::npos) << message;
  EXPECT_NE(message.find("parallel.zero"), std::string::npos) << message;
  EXPECT_EQ(deck_error(kTinyTrain + "[train]\nbatch_size = 2\n", {out, "--parallel.zero=zero1"}, 2), "");
  EXPECT_EQ(deck_error(kTinyTrain + "[train]\nbatch_size = 2\n",
                       {out, "--parallel.zero=zero1", "--train.checkpoint_every=5", "--train.checkpoint_dir=" + f.path("ck")},
                       2),
            "");
}

TEST(DeckFiles, ShardedCheckpointKeys) {
  Files f;
  const std::string out = "--run.output=" + f.path("o.h5");
  // auto needs a directory to look in.
  std::string message = deck_error(kTinyTrain, {out, "--train.resume=auto"});
  EXPECT_NE(message.find("train.checkpoint_dir"), std::string::npos) << message;
  // auto with an empty (or missing) directory is a fresh start.
  EXPECT_EQ(deck_error(kTinyTrain, {out, "--train.resume=auto", "--train.checkpoint_dir=" + f.path("ck")}), "");
  // The directory must not be a file.
  message = deck_error(kTinyTrain, {out, "--train.checkpoint_dir=" + f.write("ck.h5", "x")});
  EXPECT_NE(message.find("not a directory"), std::string::npos) << message;
  // A step directory without its index is incomplete: refused, naming it.
  const std::string step = f.path("ck2/step_00000004");
  std::filesystem::create_directories(step);
  message = deck_error(kTinyTrain, {out, "--train.resume=" + step});
  EXPECT_NE(message.find("incomplete"), std::string::npos) << message;
  EXPECT_NE(message.find("index.h5"), std::string::npos) << message;
}

}  // namespace

// train.cuda_graphs: several ranks are refused naming the key; one process on a GPU with the
// modes it captures (bf16, fp8 current scaling, clipping, grad_accum) is accepted.
TEST(DeckCudaGraphs, SeveralRanksAreRefusedOneGpuIsAccepted) {
  const std::string gpu_train =
      "[run]\njob = train\n[model]\nvocab_size = 64\ncontext_length = 16\nd_model = 32\nd_ff = 64\nnum_layers = 1\n"
      "num_heads = 2\n[parallel]\ndevice = cuda\n[train]\ncuda_graphs = true\nbatch_size = 4\n";
  const std::string two = deck_error(gpu_train, {}, 2);
  EXPECT_NE(two.find("train.cuda_graphs"), std::string::npos) << two;
  EXPECT_NE(two.find("2 ranks"), std::string::npos) << two;
  EXPECT_EQ(deck_error(gpu_train, {"--precision.mode=bf16", "--optim.grad_clip=0.5", "--train.grad_accum=2"}), "");
  EXPECT_EQ(deck_error(gpu_train, {"--precision.mode=fp8"}), "");
  EXPECT_EQ(deck_error(gpu_train, {"--run.job=bench-model", "--bench.batch_size=4"}), "");
  // Off by default: the same deck on the CPU without the key is fine.
  EXPECT_EQ(deck_error(kTinyTrain, {}), "");
}

// parallel.zero = fsdp with parallel.ep > 1 is accepted (the experts' shards are FSDP's over the
// expert_dp group: docs/parallel.md, "Expert parallelism"), for training and for bench-model, on
// dp = ep (fsdp acts as one process) and dp = 2 ep; dp not a multiple of ep is still refused.
TEST(DeckExpertParallel, FsdpIsAccepted) {
  const std::string moe = kTinyTrain + "zero = fsdp\nep = 2\n[model]\nmoe_experts = 4\n[train]\nbatch_size = 8\n";
  EXPECT_EQ(deck_error(moe, {"--parallel.dp=4"}, 4), "");
  EXPECT_EQ(deck_error(moe, {"--parallel.dp=2"}, 2), "");
  EXPECT_EQ(deck_error(moe, {"--parallel.dp=4", "--run.job=bench-model", "--bench.batch_size=8"}, 4), "");
  const std::string odd = deck_error(moe, {"--parallel.dp=3"}, 3);
  EXPECT_NE(odd.find("parallel.ep"), std::string::npos) << odd;
}

// parallel.ep_exchange = copy-engine is accepted with ep > 1 on CUDA over NCCL (the node and peer
// access are checked when the exchange is set up), for training and bench-model, with any
// data-parallel strategy over expert_dp; the accounting job describes it on any device.
TEST(DeckExpertParallel, CopyEngineExchangeIsAccepted) {
  const std::string moe =
      kTinyTrain + "ep = 2\nep_exchange = copy-engine\n[model]\nmoe_experts = 4\n[train]\nbatch_size = 8\n";
  const std::vector<std::string> cuda{"--parallel.device=cuda", "--parallel.backend=nccl"};
  for (const char* zero : {"none", "zero2", "fsdp"}) {
    auto o = cuda;
    o.push_back(std::string("--parallel.zero=") + zero);
    EXPECT_EQ(deck_error(moe, o, 2), "") << zero;
    o.push_back("--parallel.dp=4");
    EXPECT_EQ(deck_error(moe, o, 4), "") << zero;
  }
  EXPECT_EQ(deck_error(moe, {"--parallel.device=cuda", "--run.job=bench-model", "--bench.batch_size=8"}, 2), "");
  EXPECT_EQ(deck_error(moe, {"--run.job=accounting"}, 2), "");
  // The same deck on the CPU is refused, naming the key.
  const std::string cpu = deck_error(moe, {}, 2);
  EXPECT_NE(cpu.find("parallel.ep_exchange"), std::string::npos) << cpu;
}
