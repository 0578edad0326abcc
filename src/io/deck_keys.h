#pragma once
// The one table of deck keys (docs/architecture.md §6). Each entry knows its name, type, meaning, allowed
// values, how to parse a value into a Config and how to print it back; the default shown is the
// value in a default-constructed Config (config.h), so defaults live in one place. The table
// drives the Boost.Program_options description, --help, docs/deck.md, to_ini and validation.
#include <functional>
#include <string>
#include <vector>

#include "lmscale/io/config.h"

namespace lmscale::io::detail {

struct DeckKey {
  std::string name;                   // "section.key"
  std::string type;                   // int, float, bool, string, path, enum, bytes, "int-list", ...
  std::string meaning;                // one sentence for --help and docs/deck.md
  std::vector<std::string> allowed;   // enums and enum lists (empty: any value of the type)
  std::string constraint;             // range in words (">= 1", "in [0, 1)"), "" for none
  // Parses `text`, checks its range and stores it; throws UsageError naming the key.
  std::function<void(Config&, const std::string& text)> set;
  // The value as deck text; set(c, get(c)) leaves c unchanged.
  std::function<std::string(const Config&)> get;

  std::string section() const { return name.substr(0, name.find('.')); }
  std::string key() const { return name.substr(name.find('.') + 1); }
  std::string default_text() const { return get(Config{}); }
  bool is_bool() const { return type == "bool"; }
};

// Every key, grouped by section in the order of docs/architecture.md §6.
const std::vector<DeckKey>& deck_keys();
const DeckKey* find_deck_key(const std::string& name);   // nullptr when unknown
std::vector<std::string> deck_key_names();
std::vector<std::string> deck_sections();                  // in table order

}  // namespace lmscale::io::detail
