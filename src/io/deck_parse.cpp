// parse_invocation / parse_deck_text: command line first, then the deck (Boost.Program_options
// keeps the first value it stores, so command-line keys win), then presets, validation and the
// resolved parallel.dp.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <boost/program_options/errors.hpp>
#include <boost/program_options/options_description.hpp>
#include <boost/program_options/parsers.hpp>
#include <boost/program_options/positional_options.hpp>
#include <boost/program_options/value_semantic.hpp>
#include <boost/program_options/variables_map.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "deck_keys.h"
#include "deck_options.h"
#include "deck_validate.h"
#include "edit_distance.h"
#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"
#include "lmscale/io/presets.h"

namespace po = boost::program_options;

namespace lmscale::io {

namespace {

// Long options only, and no prefix guessing: --model.d_mod must not silently mean --model.d_model.
constexpr int kCommandLineStyle = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                                  po::command_line_style::long_allow_next | po::command_line_style::allow_short |
                                  po::command_line_style::short_allow_next |
                                  po::command_line_style::allow_dash_for_short;

// Boost keeps pointers to the descriptions in parsed_options, so they live as long as a parse.
struct OptionSet {
  po::options_description keys = detail::key_options();
  po::options_description command_line;
  OptionSet() {
    po::options_description hidden;
    hidden.add_options()("deck", po::value<std::string>(), "deck file");
    command_line.add(keys).add(detail::action_options()).add(hidden);
  }
};

// `dashes`: how the option was written on the command line ("--" or "-"); "" for a deck key.
[[noreturn]] void unknown_key(const std::string& name, const std::string& where, const std::string& dashes) {
  const bool command_line = !dashes.empty();
  const auto sections = detail::deck_sections();
  const auto suggestion = detail::nearest_name(name, detail::deck_key_names());
  const auto dot = name.find('.');
  std::string message;
  if (!command_line && dot == std::string::npos) {
    message = fmt::format("key '{}' {} is outside any [section]", name, where);
  } else if (!command_line && std::find(sections.begin(), sections.end(), name.substr(0, dot)) == sections.end()) {
    message = fmt::format("unknown section '[{}]' (key '{}') {}", name.substr(0, dot), name, where);
  } else {
    message = fmt::format("unknown {} '{}{}' {}", command_line ? "option" : "key", dashes, name, where);
  }
  message += suggestion ? fmt::format(" (did you mean '{}{}'?)", command_line ? "--" : "", *suggestion)
                        : std::string(" (lmscale --help lists every key)");
  throw UsageError(message);
}

void reject_unregistered(const po::parsed_options& parsed, const std::string& where, bool command_line) {
  for (const auto& option : parsed.options) {
    if (!option.unregistered) continue;
    std::string name = option.string_key;
    if (name.empty() && !option.original_tokens.empty()) name = option.original_tokens.front();
    name.erase(0, name.find_first_not_of('-'));
    const std::string token = option.original_tokens.empty() ? std::string() : option.original_tokens.front();
    unknown_key(name, where, !command_line ? "" : token.rfind("--", 0) == 0 ? "--" : "-");
  }
}

po::parsed_options parse_command_line(const std::vector<std::string>& args, const OptionSet& options,
                                      bool allow_deck) {
  po::positional_options_description positional;
  if (allow_deck) positional.add("deck", 1);
  try {
    return po::command_line_parser(args)
        .options(options.command_line)
        .positional(positional)
        .style(kCommandLineStyle)
        .allow_unregistered()
        .run();
  } catch (const po::too_many_positional_options_error&) {
    throw UsageError(allow_deck ? "more than one deck file given; give one deck and settings as --section.key=value"
                                : "settings must have the form --section.key=value");
  } catch (const po::error& e) {
    throw UsageError(fmt::format("{} (on the command line)", e.what()));
  }
}

// `--section.key=` (an empty value) clears a key: Boost refuses an empty adjacent value, so these
// arguments are taken out before it parses and set to "" afterwards (the command line still wins
// over the deck). Only names of deck keys: anything else is left for Boost to report.
std::vector<std::string> take_empty_assignments(std::vector<std::string>& args) {
  const auto names = detail::deck_key_names();
  std::vector<std::string> empties, rest;
  for (const auto& arg : args) {
    const std::string name = arg.size() > 3 && arg.rfind("--", 0) == 0 && arg.back() == '=' ? arg.substr(2, arg.size() - 3)
                                                                                            : std::string();
    if (!name.empty() && std::find(names.begin(), names.end(), name) != names.end()) {
      if (std::find(empties.begin(), empties.end(), name) != empties.end())
        throw UsageError(fmt::format("key '{}' is given more than once (on the command line); keep one", name));
      empties.push_back(name);
    } else {
      rest.push_back(arg);
    }
  }
  args = std::move(rest);
  return empties;
}

// Named apart from po::store, which argument-dependent lookup would prefer for a const char* `where`.
void store_values(const po::parsed_options& parsed, po::variables_map& vm, const std::string& where) {
  try {
    po::store(parsed, vm);
  } catch (const po::multiple_occurrences& e) {
    std::string name = e.get_option_name();
    name.erase(0, name.find_first_not_of('-'));
    throw UsageError(fmt::format("key '{}' is given more than once ({}); keep one", name, where));
  } catch (const po::error& e) {
    throw UsageError(fmt::format("{} ({})", e.what(), where));
  }
}

std::string read_deck(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw UsageError(fmt::format("deck file '{}' not found", path));
  if (std::filesystem::is_directory(path, ec))
    throw UsageError(fmt::format("deck '{}' is a directory; give an INI file", path));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) throw UsageError(fmt::format("cannot read deck file '{}'", path));
  return text.str();
}

// Length of the valid UTF-8 sequence at text[i], or 0 when it is not one.
std::size_t utf8_length(const std::string& text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b = byte(i);
  if (b < 0x80) return 1;
  std::size_t n = 0;
  std::uint32_t cp = 0;
  if ((b & 0xE0) == 0xC0) n = 2, cp = b & 0x1Fu;
  else if ((b & 0xF0) == 0xE0) n = 3, cp = b & 0x0Fu;
  else if ((b & 0xF8) == 0xF0) n = 4, cp = b & 0x07u;
  else return 0;
  if (i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3Fu);
  }
  static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;   // overlong, surrogate
  return n;
}

// A deck is UTF-8 text: a leading byte-order mark is dropped (editors on Windows write one), and a
// file with NUL or other control bytes, or bytes that are not UTF-8, is refused with its line number
// (never echoed: issue 36).
std::string checked_deck_text(std::string text, const std::string& deck_name) {
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < text.size(); ++column) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b == '\n') {
      ++line;
      column = 0;
      ++i;
      continue;
    }
    const std::size_t n = (b < 0x20 && b != '\t' && b != '\r') || b == 0x7F ? 0 : utf8_length(text, i);
    if (n == 0)
      throw UsageError(fmt::format("deck {}: line {} is not text (byte 0x{:02X} at column {}); a deck is a UTF-8 INI "
                                   "text file: give the deck's path, not a binary or results file",
                                   deck_name, line, b, column));
    i += n;
  }
  return text;
}

// Shell-quoted, so that the recorded command line can be pasted back into a shell.
std::string quote_argument(const std::string& arg) {
  const bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || std::string_view("_-./=:,+@%").find(ch) != std::string_view::npos;
  });
  if (plain) return arg;
  std::string quoted = "'";
  for (char ch : arg) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

// The command-line values are in `vm` already; the deck's values are stored after them.
Config resolve(po::variables_map& vm, const po::parsed_options& command_line, const OptionSet& options,
               const std::string& raw_deck_text, const std::string& deck_name, int world_size, bool require_job,
               const std::vector<std::string>& empties) {
  const std::string in_deck = "in " + deck_name;
  const std::string deck_text = checked_deck_text(raw_deck_text, deck_name);
  reject_unregistered(command_line, "on the command line", true);
  po::parsed_options deck(&options.keys);
  try {
    std::istringstream in(deck_text);
    deck = po::parse_config_file(in, options.keys, /*allow_unregistered=*/true);
  } catch (const po::error& e) {
    throw UsageError(fmt::format("{}: {}", deck_name, e.what()));
  }
  reject_unregistered(deck, in_deck, false);
  store_values(deck, vm, in_deck);

  std::set<std::string> from_command_line;
  for (const auto& option : command_line.options)
    if (!option.unregistered) from_command_line.insert(option.string_key);
  for (const auto& name : empties)
    if (from_command_line.contains(name))
      throw UsageError(fmt::format("key '{}' is given more than once (on the command line); keep one", name));
  from_command_line.insert(empties.begin(), empties.end());

  Config c;
  std::set<std::string> explicit_keys;
  for (const auto& key : detail::deck_keys()) {
    const bool cleared = std::find(empties.begin(), empties.end(), key.name) != empties.end();
    if (vm.count(key.name) == 0 && !cleared) continue;
    explicit_keys.insert(key.name);
    try {
      key.set(c, cleared ? std::string() : vm[key.name].as<std::string>());
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("{} ({})", e.what(), from_command_line.contains(key.name) ? "on the command line" : in_deck));
    }
  }
  // Every other check depends on the job, and a deck without one would run the default (train):
  // an empty or job-less deck is an error rather than a minute of unasked-for training.
  if (require_job && !explicit_keys.contains("run.job")) {
    constexpr const char* jobs = "bench-model, bench-attention, bench-gemm, bench-collectives, train or accounting";
    if (deck_name == "the deck")
      throw UsageError(fmt::format("no deck and no run.job given; usage: lmscale DECK.ini [--section.key=value ...], "
                                   "where the deck sets run.job = {} (or give --run.job=JOB)",
                                   jobs));
    throw UsageError(fmt::format("deck '{}' sets no run.job{}; set run.job = {} in its [run] section (or give "
                                 "--run.job=JOB)",
                                 deck_name, deck.options.empty() ? " (it sets no key at all)" : "",
                                 jobs));
  }
  apply_preset(c, explicit_keys);
  // accounting: the checks and parallel.dp are those of the planned run, not of this process.
  world_size = planned_world(c, world_size);
  validate(c, world_size);
  c.parallel.dp = detail::resolved_dp(c, world_size);
  c.deck_text = deck_text;
  c.resolved = to_ini(c);
  return c;
}

// --world-size=N: --print-config checks the deck for N ranks while running as one process (a job
// script validates before srun). A launched run takes its size from MPI only.
int requested_world_size(const po::variables_map& vm, int mpi_world_size) {
  const std::string text = vm["world-size"].as<std::string>();
  if (!vm["print-config"].as<bool>())
    throw UsageError(fmt::format("--world-size={} goes only with --print-config (to check a deck for N ranks "
                                 "without launching them); a run's world size is the number of ranks launched: "
                                 "mpirun -np N or srun --ntasks=N",
                                 text));
  const bool digits = !text.empty() && text.size() <= 9 &&
                      std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  const int n = digits ? std::stoi(text) : 0;
  if (n < 1) throw UsageError(fmt::format("--world-size='{}' is not a rank count; give a whole number >= 1, e.g. --world-size=4", text));
  if (mpi_world_size > 1 && n != mpi_world_size)
    throw UsageError(fmt::format("--world-size={} but {} MPI ranks were launched; drop --world-size, or run "
                                 "lmscale --print-config as one process",
                                 n, mpi_world_size));
  return n;
}

}  // namespace

Invocation parse_invocation(int argc, const char* const* argv, int world_size) {
  std::vector<std::string> args(argv + std::min(argc, 1), argv + argc);
  const std::vector<std::string> empties = take_empty_assignments(args);
  const OptionSet options;
  const po::parsed_options command_line = parse_command_line(args, options, /*allow_deck=*/true);
  po::variables_map vm;
  store_values(command_line, vm, "on the command line");

  Invocation inv;
  if (vm["help"].as<bool>()) {
    inv.action = Invocation::Action::help;
  } else if (vm["help-markdown"].as<bool>()) {
    inv.action = Invocation::Action::help_markdown;
  } else if (vm["version"].as<bool>()) {
    inv.action = Invocation::Action::version;
  } else {
    inv.action = vm["print-config"].as<bool>() ? Invocation::Action::print_config : Invocation::Action::run;
    reject_unregistered(command_line, "on the command line", true);
    if (vm.count("world-size") != 0) world_size = requested_world_size(vm, world_size);
    inv.world_size = world_size;
    std::string deck_path, deck_text;
    if (vm.count("deck") != 0) {
      deck_path = vm["deck"].as<std::string>();
      deck_text = read_deck(deck_path);
    }
    inv.config = resolve(vm, command_line, options, deck_text, deck_path.empty() ? "the deck" : deck_path, world_size,
                         /*require_job=*/true, empties);
    inv.config.deck_path = deck_path;
    inv.world_size = planned_world(inv.config, world_size);
  }
  std::vector<std::string> quoted;
  for (int i = 0; i < argc; ++i) quoted.push_back(quote_argument(argv[i]));
  inv.config.command_line = fmt::format("{}", fmt::join(quoted, " "));
  return inv;
}

Config parse_deck_text(const std::string& deck_text, const std::vector<std::string>& overrides, int world_size) {
  std::vector<std::string> args;
  for (const auto& o : overrides) args.push_back(o.rfind("--", 0) == 0 ? o : "--" + o);
  const std::vector<std::string> empties = take_empty_assignments(args);
  const OptionSet options;
  const po::parsed_options command_line = parse_command_line(args, options, /*allow_deck=*/false);
  po::variables_map vm;
  store_values(command_line, vm, "on the command line");
  for (const char* action : {"help", "help-markdown", "version", "print-config"})
    if (vm[action].as<bool>()) throw UsageError(fmt::format("--{} is an action, not a setting", action));
  if (vm.count("world-size") != 0) throw UsageError("--world-size goes with --print-config, not in a setting list");
  return resolve(vm, command_line, options, deck_text, "the deck", world_size, /*require_job=*/false, empties);
}

}  // namespace lmscale::io
