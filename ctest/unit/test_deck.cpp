// Deck parsing (io/deck.h): defaults, presets, command line over deck, lists, booleans, byte
// counts, to_ini round trip, actions, provenance, and docs/deck.md kept in step with the table.
#include <gtest/gtest.h>

#include "temp_dir.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"
#include "lmscale/io/presets.h"

namespace {

using lmscale::Config;
using lmscale::UsageError;
using lmscale::io::Invocation;
using lmscale::io::parse_deck_text;
using lmscale::io::to_ini;
using namespace lmscale;   // the deck enums (io/config.h)

const std::filesystem::path kRepo = LMSCALE_SOURCE_DIR;   // (not __FILE__: ccache base_dir makes it relative)

// Every setting, provenance aside.
void expect_same_settings(const Config& a, const Config& b) {
  EXPECT_EQ(a.run, b.run);
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.parallel, b.parallel);
  EXPECT_EQ(a.bench, b.bench);
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.optim, b.optim);
  EXPECT_EQ(a.data, b.data);
  EXPECT_EQ(a.cost, b.cost);
  EXPECT_EQ(a.prune, b.prune);
}

using lmscale::test::TempDir;

Invocation invoke(std::vector<std::string> args, int world = 1) {
  args.insert(args.begin(), "lmscale");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return lmscale::io::parse_invocation(static_cast<int>(argv.size()), argv.data(), world);
}

TEST(Deck, EmptyDeckGivesDefaults) {
  const Config c = parse_deck_text("", {}, 1);
  Config expected;
  expected.parallel.dp = 1;   // 0 (auto) resolves to world / (tp * pp)
  expect_same_settings(c, expected);
  EXPECT_EQ(c.resolved, to_ini(c));
  EXPECT_TRUE(c.deck_text.empty());
}

TEST(Deck, SectionsKeysCommentsAndQuotes) {
  const Config c = parse_deck_text(R"(
# a comment line
[run]
job = bench-model        # trailing comment
output = "outputs/with space.h5"
seed = 18446744073709551615
[model]
d_model=256
num_heads = 8
[optim]
lr = 3e-4
)",
                                   {}, 1);
  EXPECT_EQ(c.run.job, JobKind::bench_model);
  EXPECT_EQ(c.run.output, "outputs/with space.h5");
  EXPECT_EQ(c.run.seed, 18446744073709551615ULL);
  EXPECT_EQ(c.model.d_model, 256);
  EXPECT_EQ(c.model.num_heads, 8);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
}

TEST(Deck, EveryPresetFillsModelKeys) {
  for (const auto& p : lmscale::io::model_presets()) {
    // A mixture-of-experts preset runs on CPUs only in this version: in a CUDA build
    // parallel.device = auto would pick the GPU and the deck would be refused (deck_moe.cpp).
    const std::string device = p.moe_experts > 0 ? "[parallel]\ndevice = cpu\n" : "";
    const Config c = parse_deck_text("[model]\nsize = " + p.name + "\n" + device, {}, 1);
    EXPECT_EQ(c.model.size, p.name);
    EXPECT_EQ(c.model.d_model, p.d_model) << p.name;
    EXPECT_EQ(c.model.d_ff, p.d_ff) << p.name;
    EXPECT_EQ(c.model.num_layers, p.num_layers) << p.name;
    EXPECT_EQ(c.model.num_heads, p.num_heads) << p.name;
    EXPECT_EQ(c.model.vocab_size, p.vocab_size) << p.name;
    EXPECT_DOUBLE_EQ(c.optim.beta2, p.beta2) << p.name;
  }
}

TEST(Deck, PresetValuesMatchDesign) {
  // docs/architecture.md §2, spelled out so that a change to the preset table is noticed.
  const Config small = parse_deck_text("[model]\nsize = small\n", {}, 1);
  EXPECT_EQ(small.model.d_model, 768);
  EXPECT_EQ(small.model.d_ff, 3072);
  EXPECT_EQ(small.model.num_layers, 12);
  EXPECT_EQ(small.model.num_heads, 12);
  EXPECT_EQ(small.model.vocab_size, 10000);
  EXPECT_DOUBLE_EQ(small.optim.beta2, 0.999);
  const Config b27 = parse_deck_text("[model]\nsize = 2.7b\n", {}, 1);   // case-insensitive
  EXPECT_EQ(b27.model.size, "2.7B");
  EXPECT_EQ(b27.model.d_model, 2560);
  EXPECT_EQ(b27.model.d_ff, 10240);
  EXPECT_EQ(b27.model.num_layers, 32);
  EXPECT_EQ(b27.model.num_heads, 32);
  const Config b8 = parse_deck_text("[model]\nsize = 8b\n", {}, 1);
  EXPECT_EQ(b8.model.d_model, 4096);
  EXPECT_EQ(b8.model.d_ff, 11008);
  EXPECT_EQ(b8.model.num_layers, 34);
  EXPECT_EQ(b8.model.num_heads, 32);
  EXPECT_EQ(b8.model.vocab_size, 151936);
  EXPECT_DOUBLE_EQ(b8.optim.beta2, 0.95);
}

TEST(Deck, ExplicitKeysWinOverPreset) {
  const Config c = parse_deck_text("[model]\nsize = 8b\nnum_layers = 2\n[optim]\nbeta2 = 0.98\n", {"model.vocab_size=512"}, 1);
  EXPECT_EQ(c.model.num_layers, 2);       // deck
  EXPECT_EQ(c.model.vocab_size, 512);     // command line
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.98);  // deck
  EXPECT_EQ(c.model.d_model, 4096);       // preset
  EXPECT_EQ(c.model.d_ff, 11008);         // preset
  // A key set to the default value is still explicit.
  const Config d = parse_deck_text("[model]\nsize = small\nvocab_size = 10000\nd_model = 512\nnum_heads = 16\n", {}, 1);
  EXPECT_EQ(d.model.d_model, 512);
  EXPECT_EQ(d.model.num_heads, 16);
  EXPECT_EQ(d.model.num_layers, 12);
}

TEST(Deck, CommandLineWinsOverDeck) {
  const std::string deck = "[run]\njob = train\n[model]\nd_model = 256\nnum_heads = 8\n[train]\nsteps = 7\n";
  const Config c = parse_deck_text(deck, {"--model.d_model=128", "train.batch_size=16"}, 1);
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.model.num_heads, 8);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.train.batch_size, 16);

  TempDir dir;
  const std::string path = dir.write("deck.ini", deck);
  const Invocation inv = invoke({path, "--model.d_model", "64", "--train.steps=9"});
  EXPECT_EQ(inv.config.model.d_model, 64);   // "--key value" form
  EXPECT_EQ(inv.config.train.steps, 9);
  // The command line may come before the deck path.
  EXPECT_EQ(invoke({"--train.steps=11", path}).config.train.steps, 11);
}

TEST(Deck, Lists) {
  const Config c = parse_deck_text(R"([bench]
seq_lens = 128, 256 ,512
head_dims = 16,128
attn_batch = 4
impls = FLASH
passes = forward,forward-backward
dtypes = fp32,bf16,fp16
causal = true,off,1
ops = all-gather,broadcast
)",
                                   {}, 1);
  EXPECT_EQ(c.bench.seq_lens, (std::vector<std::int64_t>{128, 256, 512}));
  EXPECT_EQ(c.bench.head_dims, (std::vector<std::int64_t>{16, 128}));
  EXPECT_EQ(c.bench.attn_batch, (std::vector<std::int64_t>{4}));
  EXPECT_EQ(c.bench.impls, (std::vector<AttentionImpl>{AttentionImpl::flash}));
  EXPECT_EQ(c.bench.passes, (std::vector<AttentionPass>{AttentionPass::forward, AttentionPass::forward_backward}));
  EXPECT_EQ(c.bench.dtypes, (std::vector<FloatType>{FloatType::fp32, FloatType::bf16, FloatType::fp16}));
  EXPECT_EQ(c.bench.causal, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(c.bench.ops, (std::vector<CollectiveOp>{CollectiveOp::all_gather, CollectiveOp::broadcast}));
}

TEST(Deck, Booleans) {
  const std::vector<std::pair<std::string, bool>> cases{
      {"true", true}, {"false", false}, {"1", true},  {"0", false},   {"yes", true},
      {"no", false},  {"on", true},     {"off", false}, {"TRUE", true}, {"Off", false}};
  for (const auto& [text, value] : cases) {
    const Config c = parse_deck_text("[precision]\ntf32 = " + text + "\n", {}, 1);
    EXPECT_EQ(c.precision.tf32, value) << text;
  }
}

TEST(Deck, ByteCounts) {
  const Config c = parse_deck_text("[bench]\nmin_bytes = 64K\nmax_bytes = 2G\n", {}, 1);
  EXPECT_EQ(c.bench.min_bytes, 64 * 1024);
  EXPECT_EQ(c.bench.max_bytes, 2LL * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_deck_text("", {"bench.min_bytes=3MiB"}, 1).bench.min_bytes, 3 * 1024 * 1024);
  EXPECT_EQ(parse_deck_text("", {"bench.min_bytes=1000"}, 1).bench.min_bytes, 1000);
}

// A config with every field different from its default.
Config everything_changed() {
  Config c;
  c.run = {JobKind::bench_model, "out dir/x.h5", 42, false, "out dir/x.trace.json", "out dir/x.metrics.jsonl"};
  c.model = {"custom", 321, 77, 96, 200, 3, 6, 5000.5, 1e-6, AttentionImpl::flash};
  c.precision = {PrecisionMode::bf16, true, true, 1024.0, 17};
  c.parallel = {DeviceChoice::cuda, BackendChoice::nccl, 2, 1, 1, DdpKind::bucketed, 12.5, GradReduceDtype::bf16,
                GradExchange::nccl, ZeroLevel::zero2, OffloadMode::none, 5, false, 2, false, 3, PipelineSchedule::gpipe, 1, {3}, true, 45, true};
  c.bench.mode = BenchMode::forward;
  c.bench.warmup = 0;
  c.bench.steps = 3;
  c.bench.batch_size = 6;
  c.bench.memory_timeline = true;
  c.bench.impls = {AttentionImpl::flash};
  c.bench.passes = {AttentionPass::backward, AttentionPass::forward};
  c.bench.attn_batch = {2, 8};
  c.bench.attn_heads = {4, 32};
  c.bench.seq_lens = {256, 4096};
  c.bench.head_dims = {32, 128};
  c.bench.dtypes = {FloatType::fp16, FloatType::fp32};
  c.bench.causal = {false, true};
  c.bench.ops = {CollectiveOp::reduce_scatter, CollectiveOp::broadcast};
  c.bench.algo = CollectiveAlgo::ring;
  c.bench.min_bytes = 8;
  c.bench.max_bytes = 3 << 20;
  c.bench.step_factor = 2;
  c.bench.inplace = true;
  c.bench.check = false;
  c.train = {11, 24, 2, 5, 3, 2, "w.h5", "r.h5", 4, "ck.h5", Checkpointing::every_k, 2, "ckdir", 5, NewerCheckpoints::move_aside, true, 1};
  c.optim = {OptimizerName::lamb, 0.0123, 1e-7, 3, 9, 0.1, 0.85, 0.98, 1e-10, 0.5, 0.8};
  c.data = {DataSource::tokens, "train.bin", "val.bin", TokenDtype::uint32, 0.25};
  c.cost = {1e12, 64, 2.5, 0.6, 0.45, "bench.h5", 4.0, 0.5, 0.002, 7};
  c.prune = {"w.h5", PruneMethod::structured, PruneSchedule::loss_guided, 0.75, 5, 7, 3.5, 0.1, "pruned.h5"};
  return c;
}

TEST(Deck, ToIniRoundTripsEveryKey) {
  const Config c = everything_changed();
  // Check the premise: every section differs from the default.
  const Config d;
  EXPECT_NE(c.run, d.run);
  EXPECT_NE(c.data, d.data);
  const std::string ini = to_ini(c);
  // bench-model with dp = 2 needs 2 ranks; the token files are not read by bench-model.
  const Config back = parse_deck_text(ini, {}, 2);
  expect_same_settings(back, c);
  EXPECT_EQ(to_ini(back), ini);
  // parallel.grad_exchange's other value cannot join the config above (copy-engine sums fp32
  // gradients; the one above reduces in bf16): its own round trip.
  Config ce;
  ce.parallel.dp = 1;
  ce.parallel.device = DeviceChoice::cuda;
  ce.parallel.zero = ZeroLevel::zero2;
  ce.parallel.grad_exchange = GradExchange::copy_engine;
  expect_same_settings(parse_deck_text(to_ini(ce), {}, 1), ce);
  // parallel.fsdp_gather_dtype = fp8 needs fsdp and precision.mode = fp8: its own round trip.
  Config g;
  g.parallel.dp = 1;
  g.parallel.device = DeviceChoice::cpu;
  g.parallel.zero = ZeroLevel::fsdp;
  g.precision.mode = PrecisionMode::fp8;
  g.parallel.fsdp_gather_dtype = FsdpGatherDtype::fp8;
  const Config g_back = parse_deck_text(to_ini(g), {}, 1);
  expect_same_settings(g_back, g);
  EXPECT_EQ(g_back.parallel.fsdp_gather_dtype, FsdpGatherDtype::fp8);
  // parallel.ep_exchange = copy-engine needs ep > 1 (an MoE model) on CUDA: its own round trip.
  Config ep;
  ep.parallel.dp = 2;
  ep.parallel.ep = 2;
  ep.parallel.device = DeviceChoice::cuda;
  ep.model.moe_experts = 4;
  ep.train.batch_size = 4;
  ep.parallel.ep_exchange = EpExchange::copy_engine;
  const Config ep_back = parse_deck_text(to_ini(ep), {}, 2);
  expect_same_settings(ep_back, ep);
  EXPECT_EQ(ep_back.parallel.ep_exchange, EpExchange::copy_engine);
  // The default config too.
  Config defaults;
  defaults.parallel.dp = 1;
  expect_same_settings(parse_deck_text(to_ini(defaults), {}, 1), defaults);
}

TEST(Deck, ToIniFloatsAreExact) {
  Config c;
  c.optim.lr = 0.1 + 0.2;   // not representable in few digits
  c.optim.eps = 1.0 / 3.0;
  c.parallel.dp = 1;
  const Config back = parse_deck_text(to_ini(c), {}, 1);
  EXPECT_EQ(back.optim.lr, c.optim.lr);
  EXPECT_EQ(back.optim.eps, c.optim.eps);
}

TEST(Deck, DataParallelDegreeResolvesFromWorldSize) {
  const Config c = parse_deck_text("[parallel]\ntp = 2\n[model]\nd_model = 512\nnum_heads = 8\n", {}, 8);
  EXPECT_EQ(c.parallel.dp, 4);
  EXPECT_NE(c.resolved.find("dp = 4"), std::string::npos);
  // Explicit dp is kept.
  EXPECT_EQ(parse_deck_text("[parallel]\ndp = 2\ntp = 2\n", {}, 4).parallel.dp, 2);
}

TEST(Deck, InvocationFillsProvenance) {
  TempDir dir;
  const std::string text = "[run]\njob = train\n[model]\nd_model = 256   # narrower\nnum_heads = 8\n";
  const std::string path = dir.write("deck.ini", text);
  const Invocation inv = invoke({path, "--train.steps=5", "--run.output=a b.h5"});
  EXPECT_EQ(inv.action, Invocation::Action::run);
  EXPECT_EQ(inv.config.deck_path, path);
  EXPECT_EQ(inv.config.deck_text, text);
  EXPECT_EQ(inv.config.command_line, "lmscale " + path + " --train.steps=5 '--run.output=a b.h5'");
  EXPECT_EQ(inv.config.resolved, to_ini(inv.config));
  EXPECT_NE(inv.config.resolved.find("d_model = 256"), std::string::npos);
  EXPECT_EQ(inv.config.run.output, "a b.h5");
}

TEST(Deck, InvocationWithoutDeckUsesDefaultsAndCommandLine) {
  const Invocation inv = invoke({"--run.job=train", "--model.d_model=64", "--model.num_heads=4"});
  EXPECT_EQ(inv.action, Invocation::Action::run);
  EXPECT_EQ(inv.config.model.d_model, 64);
  EXPECT_EQ(inv.config.model.num_layers, Config{}.model.num_layers);
  EXPECT_TRUE(inv.config.deck_path.empty());
}

TEST(Deck, Actions) {
  EXPECT_EQ(invoke({"--help"}).action, Invocation::Action::help);
  EXPECT_EQ(invoke({"-h"}).action, Invocation::Action::help);
  EXPECT_EQ(invoke({"--help-markdown"}).action, Invocation::Action::help_markdown);
  EXPECT_EQ(invoke({"--version"}).action, Invocation::Action::version);
  // --help needs no valid deck.
  EXPECT_EQ(invoke({"/nonexistent/deck.ini", "--help"}).action, Invocation::Action::help);
  const Invocation print = invoke({"--print-config", "--run.job=train", "--model.d_model=64", "--model.num_heads=4"});
  EXPECT_EQ(print.action, Invocation::Action::print_config);
  EXPECT_NE(print.config.resolved.find("d_model = 64"), std::string::npos);
  // --print-config still checks the deck.
  EXPECT_THROW(invoke({"--print-config", "--run.job=train", "--model.num_heads=7"}), UsageError);
  EXPECT_NE(lmscale::io::version_text().find("lmscale "), std::string::npos);
}

// --world-size=N lets one process (a Slurm job script before srun) check a deck for N ranks: a tp=2
// deck is refused on 1 rank and accepted for 2, with dp resolved for N. Bad uses are errors.
TEST(Deck, PrintConfigWorldSize) {
  const std::vector<std::string> tp2{"--print-config", "--run.job=train", "--parallel.tp=2"};
  EXPECT_THROW(invoke(tp2), UsageError);
  auto with = [&](const std::string& extra, int world = 1) {
    auto args = tp2;
    args.push_back(extra);
    return invoke(args, world);
  };
  const Invocation four = with("--world-size=4");
  EXPECT_EQ(four.action, Invocation::Action::print_config);
  EXPECT_EQ(four.world_size, 4);
  EXPECT_EQ(four.config.parallel.dp, 2);
  EXPECT_EQ(with("--world-size=2", 2).world_size, 2);   // launched on 2 ranks: the same N is fine
  EXPECT_EQ(invoke({"--print-config", "--run.job=train"}, 2).world_size, 2);   // without it: the MPI world
  EXPECT_THROW(with("--world-size=3"), UsageError);     // tp=2 does not divide 3
  for (const std::string bad : {"--world-size=0", "--world-size=two", "--world-size=-2", "--world-size="}) {
    try {
      with(bad);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--world-size"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(with("--world-size=4", 2), UsageError);  // 2 ranks launched, 4 asked
  try {
    invoke({"--run.job=train", "--world-size=2"});
    ADD_FAILURE() << "--world-size without --print-config accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--print-config"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_deck_text("", {"--world-size=2"}, 1), UsageError);
}

// run.job = accounting plans a run of accounting.world ranks from one process (issue 38): dp
// resolves against the planned world, parallel.dp alone plans dp x tp x pp, and a planned world
// that contradicts the layout is an error naming accounting.world. Other jobs run on the launched
// ranks whatever accounting.world says.
TEST(Deck, AccountingPlansItsWorld) {
  const Invocation two = invoke({"--run.job=accounting", "--accounting.world=2"});
  EXPECT_EQ(two.world_size, 2);
  EXPECT_EQ(two.config.parallel.dp, 2);
  const Invocation tp = invoke({"--run.job=accounting", "--accounting.world=8", "--parallel.tp=2"});
  EXPECT_EQ(tp.world_size, 8);
  EXPECT_EQ(tp.config.parallel.dp, 4);
  EXPECT_EQ(io::planned_world(tp.config, 1), 8);
  const Invocation dp = invoke({"--run.job=accounting", "--parallel.dp=3"});
  EXPECT_EQ(dp.world_size, 3);
  EXPECT_EQ(io::planned_world(dp.config, 1), 3);
  EXPECT_EQ(invoke({"--run.job=accounting"}, 4).world_size, 4);   // no key: the launched ranks
  // A train deck is checked for the ranks launched: dp 0 resolves to 1 on one process.
  EXPECT_EQ(invoke({"--run.job=train", "--accounting.world=2"}).config.parallel.dp, 1);
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--run.job=accounting", "--accounting.world=3", "--parallel.tp=2"},
        std::vector<std::string>{"--run.job=accounting", "--accounting.world=4", "--parallel.dp=2"}}) {
    try {
      invoke(bad);
      ADD_FAILURE() << "no error for " << bad[1] << " " << bad[2];
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("accounting.world"), std::string::npos) << e.what();
    }
  }
}

// The executable runs only what a deck asks for: an empty or job-less deck (or no deck and no
// --run.job) is an error naming run.job, for running and for --print-config alike. Tests and
// tools that build configs with parse_deck_text keep the default job.
TEST(Deck, InvocationNeedsRunJob) {
  TempDir dir;
  const std::string empty = dir.write("empty.ini", "");
  const std::string comments = dir.write("comments.ini", "# nothing but a comment\n");
  const std::string jobless = dir.write("jobless.ini", "[model]\nd_model = 64\nnum_heads = 4\n");
  const std::vector<std::vector<std::string>> cases{
      {empty}, {comments}, {jobless}, {}, {"--model.d_model=64", "--model.num_heads=4"}, {"--print-config", jobless}};
  for (const auto& args : cases) {
    try {
      invoke(args);
      ADD_FAILURE() << "no error for " << (args.empty() ? "no arguments" : args.back());
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("run.job"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("accounting"), std::string::npos) << "lists the jobs: " << e.what();
    }
  }
  try {
    invoke({empty});
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("sets no key at all"), std::string::npos) << e.what();
  }
  // The job given on the command line or in the deck is enough.
  EXPECT_EQ(invoke({jobless, "--run.job=accounting"}).config.run.job, JobKind::accounting);
  EXPECT_EQ(invoke({dir.write("job.ini", "[run]\njob = bench-model\n")}).config.run.job, JobKind::bench_model);
  EXPECT_EQ(parse_deck_text("", {}, 1).run.job, JobKind::train);
}

TEST(Deck, MissingDeckFileNamesThePath) {
  try {
    invoke({"/nonexistent/dir/deck.ini"});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/deck.ini"), std::string::npos) << e.what();
  }
}

TEST(Deck, UnknownKeyMessageHasSuggestion) {
  TempDir dir;
  const std::string path = dir.write("deck.ini", "[model]\nd_modle = 512\n");
  try {
    invoke({path});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "unknown key 'model.d_modle' in " + path + " (did you mean 'model.d_model'?)");
  }
  try {
    invoke({"--train.stpes=3"});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "unknown option '--train.stpes' on the command line (did you mean '--train.steps'?)");
  }
  // No prefix guessing: an abbreviation is an unknown option, not d_model.
  EXPECT_THROW(invoke({"--model.d_mod=3"}), UsageError);
  // One deck only.
  try {
    invoke({"a.ini", "b.ini"});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("more than one deck"), std::string::npos) << e.what();
  }
}

TEST(Deck, BadValueSaysWhereItCameFrom) {
  try {
    parse_deck_text("[model]\nd_model = 512\n", {"model.d_model=wide"}, 1);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.d_model"), std::string::npos) << m;
    EXPECT_NE(m.find("'wide'"), std::string::npos) << m;
    EXPECT_NE(m.find("on the command line"), std::string::npos) << m;
  }
}

TEST(Deck, ValidateChecksConfigsBuiltInCode) {
  Config c;
  EXPECT_NO_THROW(lmscale::io::validate(c, 1));
  c.bench.head_dims = {0};
  EXPECT_THROW(lmscale::io::validate(c, 1), UsageError);
  c.bench.head_dims = {48, 80, 256};   // any head dim on CPU and up to 256 with flash on CUDA
  EXPECT_NO_THROW(lmscale::io::validate(c, 1));
  c.parallel.device = DeviceChoice::cuda;
  c.run.job = JobKind::bench_attention;
  c.bench.head_dims = {64, 264};
  EXPECT_THROW(lmscale::io::validate(c, 1), UsageError);
  c.parallel.device = DeviceChoice::cpu;   // CPU flash takes any head dim
  EXPECT_NO_THROW(lmscale::io::validate(c, 1));
  c = Config{};
  c.run.job = JobKind::bench_model;
  c.model.attention = AttentionImpl::flash;
  c.model.d_model = 2560;   // the 2.7B preset: 32 heads of 80, runs on CUDA
  c.model.num_heads = 32;
  c.parallel.device = DeviceChoice::cuda;
  EXPECT_NO_THROW(lmscale::io::validate(c, 1));
  c.model.num_heads = 8;    // 320 > 256
  EXPECT_THROW(lmscale::io::validate(c, 1), UsageError);
  c.model.attention = AttentionImpl::naive;
  EXPECT_NO_THROW(lmscale::io::validate(c, 1));
  c = Config{};
  c.model.num_heads = 7;
  EXPECT_THROW(lmscale::io::validate(c, 1), UsageError);
  c = Config{};
  EXPECT_THROW(io::set_key(c, "run.job", "pretrain"), UsageError);   // not a job: refused as it is parsed
}

TEST(Deck, HelpListsEveryKeyWithDefault) {
  const std::string help = lmscale::io::help_text();
  const std::string ini = to_ini(Config{});
  std::istringstream lines(ini);
  std::string line, section;
  int keys = 0;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line[0] == '[') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const std::string key = section + "." + line.substr(0, line.find(' '));
    EXPECT_NE(help.find("--" + key + " "), std::string::npos) << key;
    EXPECT_NE(lmscale::io::deck_markdown().find("| `" + key + "` |"), std::string::npos) << key;
    ++keys;
  }
  EXPECT_GE(keys, 70);
  EXPECT_NE(help.find("Default: 512."), std::string::npos);
}

TEST(Deck, DocsDeckMdIsUpToDate) {
  std::ifstream in(kRepo / "docs" / "deck.md");
  ASSERT_TRUE(in) << "docs/deck.md missing; regenerate it with lmscale --help-markdown > docs/deck.md";
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_TRUE(text.str() == lmscale::io::deck_markdown())
      << "docs/deck.md differs from the key table; regenerate it with lmscale --help-markdown > docs/deck.md";
}

}  // namespace
