// Text forms of the key table: --help, docs/deck.md (--help-markdown), and the resolved INI that
// --print-config shows and the HDF5 root attribute `config` stores.
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "deck_keys.h"
#include "deck_options.h"
#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"
#include "lmscale/io/presets.h"
#include "lmscale/version.h"

namespace lmscale::io {

namespace {

constexpr const char* kUsage = "Usage: lmscale [DECK.ini] [--section.key=value ...] [ACTION]";

std::string markdown_cell(std::string text) {
  std::string out;
  for (char ch : text) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return out;
}

std::string code_or_empty(const std::string& text) { return text.empty() ? "*(empty)*" : fmt::format("`{}`", text); }

}  // namespace

std::string version_text() {
  return fmt::format("lmscale {} (git {}, CUDA {})", kVersion, kGitCommit, kWithCuda ? "on" : "off");
}

std::string help_text() {
  std::ostringstream out;
  out << kUsage << "\n\n"
      << "Runs the job a deck describes (run.job): bench-model, bench-attention, bench-gemm, bench-collectives,\n"
      << "train or accounting. Every deck key can also be given on the command line as --section.key=value, which\n"
      << "wins over the deck; without a deck, defaults and command-line keys are used. Lists are\n"
      << "comma-separated (128,256,512); booleans are true/false, 1/0, yes/no or on/off. Unknown keys, bad\n"
      << "values and inconsistent combinations stop the run before any work (exit code 2), as does a deck\n"
      << "that sets no run.job.\n\n"
      << detail::action_options() << "\n"
      << detail::key_options() << "\n"
      << "The same reference, as Markdown: docs/deck.md (lmscale --help-markdown).\n";
  return out.str();
}

void set_key(Config& c, const std::string& name, const std::string& value) {
  const detail::DeckKey* key = detail::find_deck_key(name);
  if (!key) throw UsageError(fmt::format("set_key: '{}' is not a deck key", name));
  key->set(c, value);
}

std::string to_ini(const Config& c) {
  std::string out = "# lmscale resolved configuration: every key, after deck, command line, presets and\n"
                    "# parallel.dp resolution. Usable as a deck.\n";
  std::string section;
  for (const auto& key : detail::deck_keys()) {
    if (key.section() != section) {
      section = key.section();
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    }
    const std::string value = key.get(c);
    out += value.empty() ? fmt::format("{} =\n", key.key()) : fmt::format("{} = {}\n", key.key(), value);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> deck_values(const Config& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& key : detail::deck_keys()) out.emplace_back(key.name, key.get(c));
  return out;
}

std::string deck_markdown() {
  std::string md;
  md += "# Deck reference\n\n";
  md += "<!-- Generated from the key table in src/io/deck_keys.cpp by `lmscale --help-markdown`; do not edit by\n"
        "     hand. A unit test (ctest/unit/test_deck.cpp) fails when this file and the table disagree. -->\n\n";
  md += "A deck is an INI file that describes one run of `lmscale`: the job, the model, the precision, the\n"
        "parallel layout and the job's own settings. Example decks, one per job and mode, are in `inputs/`.\n\n";
  md += "```\n" + std::string(kUsage) + "\n```\n\n";
  md += "## Syntax\n\n"
        "- `[section]` lines open a section; `key = value` lines set `section.key`. Keys outside a section\n"
        "  are errors.\n"
        "- `#` starts a comment anywhere on a line, so values cannot contain `#`.\n"
        "- Every key can also be given on the command line as `--section.key=value` (or\n"
        "  `--section.key value`). The command line wins over the deck. Without a deck, defaults and\n"
        "  command-line keys are used.\n"
        "- Lists are comma-separated: `seq_lens = 128,256,512`. Empty items are errors.\n"
        "- Booleans: `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off` (any case).\n"
        "- Enumerations are matched ignoring case and stored in the spelling listed below.\n"
        "- Byte counts (`bytes`) take an optional binary suffix: `64K`, `1M`, `2G` (also `KiB`, `MiB`,\n"
        "  `GiB`).\n"
        "- Strings and paths may be wrapped in double quotes; relative paths start at the working\n"
        "  directory, not at the deck's folder.\n"
        "- A key given twice in the deck, or twice on the command line, is an error.\n"
        "- `--section.key=` (an empty value) sets the key to empty: `--train.save=` saves no weights.\n"
        "- A deck is UTF-8 text: a leading byte-order mark is ignored; a file that is not text is an\n"
        "  error naming the line. An unbalanced double quote in a value is an error naming the key.\n"
        "- A run must name its job: `run.job` in the deck or `--run.job=JOB`. An empty or job-less deck\n"
        "  is an error (exit code 2), not a default training run (also for `--print-config`).\n\n";
  md += "## Actions\n\n"
        "| option | effect |\n|---|---|\n"
        "| `--help`, `-h` | print every key with its type, default and meaning |\n"
        "| `--help-markdown` | print this reference |\n"
        "| `--version` | print the version, git commit and whether CUDA is built in |\n"
        "| `--print-config` | resolve and check the deck, print every key's value (a valid deck), run nothing |\n"
        "| `--world-size=N` | with `--print-config`: check for a run on N ranks from one process (a job script "
        "before `srun`) |\n\n";
  md += "## How a deck is resolved\n\n"
        "1. Defaults (the `default` column below).\n"
        "2. The deck's keys, then the command line's, which win.\n"
        "3. `model.size`: a preset fills `model.d_model`, `model.d_ff`, `model.num_layers`,\n"
        "   `model.num_heads`, `model.vocab_size` and `optim.beta2`, except the keys given explicitly.\n"
        "4. Checks (below); the first failure stops the run with exit code 2 and one line naming the key\n"
        "   and the fix. Unknown keys are reported with the nearest valid key.\n"
        "5. `parallel.dp = 0` becomes world size / (`tp` * `pp`).\n\n"
        "The resolved configuration is stored in every results file (root attribute `config`, see\n"
        "docs/hdf5.md) and printed by `--print-config`.\n\n";
  md += "### Presets\n\n"
        "| model.size | d_model | d_ff | num_layers | num_heads | vocab_size | optim.beta2 |\n"
        "|---|---|---|---|---|---|---|\n";
  for (const auto& p : model_presets())
    md += fmt::format("| `{}` | {} | {} | {} | {} | {} | {} |\n", p.name, p.d_model, p.d_ff, p.num_layers,
                      p.num_heads, p.vocab_size, p.beta2);
  md += "\n`custom` (the default) uses the model keys as given.\n\n";
  md += "### Checks across keys\n\n"
        "- `model.num_heads` divides `model.d_model`, and the head dimension `d_model / num_heads` is\n"
        "  even (RoPE rotates pairs).\n"
        "- `precision.mode = bf16` or `fp16` needs a CUDA device: an error with `parallel.device = cpu` (except for `run.job = accounting`, which runs nothing).\n"
        "  `parallel.backend = nccl` likewise. `precision.mode = fp8` runs on a CPU as the exact emulation of its\n"
        "  numerics, and at start-up refuses a CUDA device that is not Hopper (compute capability 9.x).\n"
        "- `precision.mode = fp8` refuses `parallel.tp > 1`, `parallel.pp > 1` and MoE models (not yet supported),\n"
        "  and needs `model.d_model`, `model.d_ff` and the rows of each micro-batch (B*T) to be multiples of 16;\n"
        "  the other `precision.fp8_*` keys keep their defaults unless `precision.mode = fp8`.\n"
        "- `parallel.tp` divides `model.num_heads`, `model.d_ff` and `model.vocab_size`; with\n"
        "  `parallel.sequence_parallel = true` it also divides `model.context_length`; `parallel.tp > 1`\n"
        "  with `parallel.zero = fsdp` shards each tp rank's slices over its dp group (2D parallelism);\n"
        "  `parallel.pp` is at most `model.num_layers`.\n"
        "- `parallel.pp > 1` for `train` needs `train.grad_accum = 1` (the pipeline accumulates over\n"
        "  `parallel.microbatches`). It composes with `parallel.tp > 1` (tensor-parallel stages, the same\n"
        "  divisibility rules) and with `dp` (ddp, zero1, zero2, and `parallel.zero = fsdp` with\n"
        "  `parallel.schedule = gpipe` or `1f1b` and `parallel.tp = 1`; fsdp with the interleaved\n"
        "  schedule or with tp x pp is refused, not predicted).\n"
        "- Jobs that run the model (`train`, `bench-model`): the global batch (`train.batch_size` or\n"
        "  `bench.batch_size`) is divisible by `parallel.dp`; `train.grad_accum` divides the per-rank\n"
        "  batch; with `parallel.pp > 1`, `parallel.microbatches` divides the per-rank batch of one pass;\n"
        "  `parallel.dp * parallel.tp * parallel.pp` equals the MPI world size (with `dp = 0`, `tp * pp`\n"
        "  must divide it). Other jobs do not use the layout: for them `dp = 0` becomes\n"
        "  world / (`tp` * `pp`) when that divides, else 1, and `accounting` takes an explicit `dp` as\n"
        "  the layout to predict, whatever the world size.\n"
        "- `data.source = tokens` needs `data.path`; for `train` the file (and `data.val_path`, if set)\n"
        "  must exist, as must `train.resume` when set. Token files are read once before any work: a\n"
        "  whole number of `data.dtype` elements, at least `model.context_length + 2` tokens, every id\n"
        "  below `model.vocab_size` (the first bad id is reported with its position).\n"
        "- `train.resume` must be an lmscale checkpoint or weights file; a sharded optimizer\n"
        "  (`parallel.zero` on more than one rank) can neither resume optimizer state nor write\n"
        "  checkpoints (`train.checkpoint_every`) yet.\n"
        "- `optim.min_lr <= optim.lr`; for `train`, `optim.warmup_steps <= train.steps`;\n"
        "  `optim.cosine_steps` is 0 or at least `optim.warmup_steps`.\n"
        "- `bench.min_bytes <= bench.max_bytes`.\n"
        "- Flash attention on CUDA (`parallel.device = cuda`, or `auto` in a CUDA build) takes head dims\n"
        "  up to 256: `model.d_model / model.num_heads` with `model.attention = flash`, and the\n"
        "  `bench.head_dims` items when `bench.impls` has `flash`.\n"
        "- Every file the run reads or writes is a file of its own, compared by identity (device and\n"
        "  inode, or canonical directory and name), not by text: `./x.h5`, absolute paths and links to\n"
        "  one file are the same file. No output lies in a `step_*` folder of `train.checkpoint_dir`.\n"
        "  A second run writing an output that a running one writes is refused, naming its pid\n"
        "  (docs/reliability.md).\n"
        "- A checkpoint to resume lies at a step in [0, `train.steps`) (`train.resume = auto` also takes\n"
        "  a completed run's last one: nothing to train, exit 0), fits the [model] keys, and is not older\n"
        "  than a complete checkpoint in `train.checkpoint_dir` (docs/checkpoints.md).\n"
        "- For `train`: `train.save` and `train.checkpoint_path` differ from `run.output`;\n"
        "  `train.checkpoint_every > 0` needs `train.checkpoint_path`.\n"
        "- Every file the run writes (`run.output`; for `train` also `train.save` and, with checkpoints,\n"
        "  `train.checkpoint_path`) follows the overwrite rule of docs/hdf5.md: a new name or an\n"
        "  existing HDF5 (or empty) regular file, never a device, FIFO, socket, directory or other file;\n"
        "  its `NAME.tmp` likewise; its directory writable or creatable.\n"
        "- Once the device is known (before any output): `train` and `bench-model` runs whose predicted\n"
        "  memory per rank (the `accounting` job's prediction; `bench.mode = forward` without gradients\n"
        "  and optimizer state) exceeds the memory available (free GPU memory, or the host's available\n"
        "  memory shared by the node's ranks) are refused, with both numbers.\n\n";
  md += "## Keys\n";
  for (const auto& section : detail::deck_sections()) {
    md += fmt::format("\n### [{}]\n\n| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n", section);
    for (const auto& key : detail::deck_keys()) {
      if (key.section() != section) continue;
      std::string allowed;
      if (!key.allowed.empty()) {
        std::vector<std::string> quoted;
        for (const auto& a : key.allowed) quoted.push_back(fmt::format("`{}`", a));
        allowed = fmt::format("{}", fmt::join(quoted, ", "));
      } else {
        allowed = key.constraint;
      }
      md += fmt::format("| `{}` | {} | {} | {} | {} |\n", key.name, key.type, code_or_empty(key.default_text()),
                        markdown_cell(allowed), markdown_cell(key.meaning));
    }
  }
  return md;
}

}  // namespace lmscale::io
