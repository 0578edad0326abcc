#pragma once
// Input decks (docs/architecture.md §6): INI files read with Boost.Program_options, every key also settable
// as --section.key=value on the command line (the command line wins). One table of keys
// (src/io/deck_keys.cpp) gives each key's type, default and meaning; it drives parsing, --help and
// docs/deck.md. Any problem -- unknown key (nearest valid key suggested), bad value, inconsistent
// combination -- throws UsageError naming the key and the fix, before any work or output.
#include <string>
#include <utility>
#include <vector>

#include "lmscale/io/config.h"

namespace lmscale::io {

struct Invocation {
  enum class Action { run, help, help_markdown, version, print_config };
  Action action = Action::run;
  // Resolved and validated when action is run or print_config (parallel.dp resolved against the
  // world size; provenance fields deck_path, deck_text, command_line, resolved filled).
  Config config;
  // The world size the deck was checked for: the MPI world's, or --world-size=N with --print-config;
  // for run.job = accounting the planned run's (planned_world).
  int world_size = 1;
};

// argv: `lmscale [DECK] [--section.key=value ...] [--help] [--help-markdown] [--version]
// [--print-config [--world-size=N]]`. world_size is the MPI world size, for checks such as dp*tp*pp;
// --world-size replaces it for --print-config run as one process.
Invocation parse_invocation(int argc, const char* const* argv, int world_size);

// The same, from a deck text and override list ("section.key=value" or "--section.key=value"),
// for tests. command_line and deck_path stay empty.
Config parse_deck_text(const std::string& deck_text, const std::vector<std::string>& overrides, int world_size);

// Sets one key from its deck text exactly as a deck line would (parsed and range-checked, no
// cross-key checks): set_key(c, "parallel.zero", "zero2"). Throws UsageError naming the key.
void set_key(Config& c, const std::string& name, const std::string& value);

// The ranks of the run a deck describes: the launched `world_size`, except for run.job =
// accounting, which plans a run of accounting.world ranks (0: parallel.dp x tp x pp when dp is
// set, else `world_size`) from any number of processes. Throws UsageError when the planned world
// and the layout disagree.
int planned_world(const Config& c, int world_size);
// Cross-key checks that need the world size; called by parse_*; exposed for tests.
void validate(const Config& c, int world_size);

std::string help_text();       // every key with type, default and meaning
std::string deck_markdown();   // docs/deck.md
// Resolved config as INI text (every key, resolved value); parse_deck_text(to_ini(c)) gives c
// back (provenance fields aside). This is what --print-config prints.
std::string to_ini(const Config& c);
// Every key of the resolved config and its value as a deck spells it ("section.key", "value"), in
// the key table's order: what to_ini prints, as pairs (the metrics stream's first line).
std::vector<std::pair<std::string, std::string>> deck_values(const Config& c);
// "lmscale 0.1.0 (git abc123, CUDA on)" for --version.
std::string version_text();

}  // namespace lmscale::io
