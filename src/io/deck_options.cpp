#include "deck_options.h"

#include <boost/program_options/value_semantic.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace po = boost::program_options;

namespace lmscale::io::detail {

std::string key_help(const DeckKey& key) {
  std::string text = key.meaning;
  if (!key.allowed.empty()) text += fmt::format(" One of: {}.", fmt::join(key.allowed, ", "));
  if (!key.constraint.empty()) text += fmt::format(" Range: {}.", key.constraint);
  const std::string def = key.default_text();
  text += def.empty() ? " Default: empty." : fmt::format(" Default: {}.", def);
  return text;
}

po::options_description key_options(unsigned line_length) {
  po::options_description all("Deck keys (`key = value` under `[section]` in a deck, or --section.key=value)",
                              line_length, line_length - 40);
  for (const auto& section : deck_sections()) {
    po::options_description group(fmt::format("[{}]", section), line_length, line_length - 40);
    for (const auto& key : deck_keys()) {
      if (key.section() != section) continue;
      group.add_options()(key.name.c_str(), po::value<std::string>()->value_name(key.type), key_help(key).c_str());
    }
    all.add(group);
  }
  return all;
}

po::options_description action_options(unsigned line_length) {
  po::options_description actions("Actions", line_length, line_length - 40);
  actions.add_options()                                                   //
      ("help,h", po::bool_switch(), "Print this help and exit.")           //
      ("help-markdown", po::bool_switch(), "Print the deck reference (docs/deck.md) and exit.")  //
      ("version", po::bool_switch(), "Print the version and exit.")       //
      ("print-config", po::bool_switch(), "Print the resolved configuration (every key) and exit.")  //
      ("world-size", po::value<std::string>()->value_name("N"),
       "With --print-config: check the deck for a run on N ranks (default: the MPI world size), e.g. in a job "
       "script before srun.");
  return actions;
}

}  // namespace lmscale::io::detail
