#pragma once
// Boost.Program_options descriptions built from the key table (deck_keys.h): the deck keys, one
// group per section, and the actions (--help, --help-markdown, --version, --print-config).
#include <string>

#include <boost/program_options/options_description.hpp>

#include "deck_keys.h"

namespace lmscale::io::detail {

// Every deck key as a string-valued option; values are parsed by the table, not by Boost, so that
// every message names the key in our words.
boost::program_options::options_description key_options(unsigned line_length = 100);
boost::program_options::options_description action_options(unsigned line_length = 100);
// The text --help shows for one key: meaning, allowed values or range, default.
std::string key_help(const DeckKey& key);

}  // namespace lmscale::io::detail
