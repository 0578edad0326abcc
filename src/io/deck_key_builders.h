#pragma once
// The builders of deck key table entries (deck_keys.h), shared by the files that hold parts of the
// table (deck_keys.cpp, deck_keys_plan.cpp). Header-only: each builder is a template over the
// field accessor.
#include <cctype>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "deck_keys.h"
#include "deck_values.h"
#include "lmscale/core/error.h"

namespace lmscale::io::detail {

// Builders: `field` is a generic lambda returning a reference to the Config member, so one
// accessor serves both set (Config&) and get (const Config&).
template <class F>
DeckKey int_key(std::string name, F field, std::int64_t min, std::string meaning) {
  DeckKey k{name, "int", std::move(meaning), {}, fmt::format(">= {}", min), {}, {}};
  k.set = [name, field, min](Config& c, const std::string& t) { field(c) = parse_int(name, t, min); };
  k.get = [field](const Config& c) { return fmt::format("{}", field(c)); };
  return k;
}

template <class F>
DeckKey uint_key(std::string name, F field, std::string meaning) {
  DeckKey k{name, "int", std::move(meaning), {}, ">= 0", {}, {}};
  k.set = [name, field](Config& c, const std::string& t) { field(c) = parse_uint(name, t); };
  k.get = [field](const Config& c) { return fmt::format("{}", field(c)); };
  return k;
}

template <class F>
DeckKey bytes_key(std::string name, F field, std::int64_t min, std::string meaning) {
  DeckKey k{name, "bytes", std::move(meaning), {}, fmt::format(">= {}; suffix K, M, G allowed", min), {}, {}};
  k.set = [name, field, min](Config& c, const std::string& t) { field(c) = parse_bytes(name, t, min); };
  k.get = [field](const Config& c) { return fmt::format("{}", field(c)); };
  return k;
}

template <class F>
DeckKey float_key(std::string name, F field, FloatRange range, std::string meaning) {
  DeckKey k{name, "float", std::move(meaning), {}, range.describe(), {}, {}};
  k.set = [name, field, range](Config& c, const std::string& t) { field(c) = parse_float(name, t, range); };
  // fmt's shortest round-trip form: parsing the text gives back the same double.
  k.get = [field](const Config& c) { return fmt::format("{}", field(c)); };
  return k;
}

template <class F>
DeckKey bool_key(std::string name, F field, std::string meaning) {
  DeckKey k{name, "bool", std::move(meaning), {}, "", {}, {}};
  k.set = [name, field](Config& c, const std::string& t) { field(c) = parse_bool(name, t); };
  k.get = [field](const Config& c) { return std::string(field(c) ? "true" : "false"); };
  return k;
}

template <class F>
DeckKey string_key(std::string name, std::string type, F field, std::string meaning) {
  DeckKey k{name, std::move(type), std::move(meaning), {}, "", {}, {}};
  k.set = [name, field](Config& c, const std::string& t) { field(c) = parse_string(t, name); };
  k.get = [field](const Config& c) { return field(c); };
  return k;
}

// A string key restricted to a list of names that is data, not a mode (model.size's presets).
template <class F>
DeckKey choice_key(std::string name, F field, std::vector<std::string> allowed, std::string meaning) {
  DeckKey k{name, "enum", std::move(meaning), allowed, "", {}, {}};
  k.set = [name, field, allowed](Config& c, const std::string& t) { field(c) = parse_enum(name, t, allowed); };
  k.get = [field](const Config& c) { return field(c); };
  return k;
}

// The deck spellings of enum E (config.h's DeckSpelling), as the key table lists them.
template <class E>
std::vector<std::string> spellings() {
  std::vector<std::string> out;
  for (std::string_view n : DeckSpelling<E>::names) out.emplace_back(n);
  return out;
}

// The value of E spelt `text` (one of spellings<E>(), any case); throws UsageError naming `key`.
template <class E>
E parse_deck_enum(const std::string& key, const std::string& text) {
  const std::vector<std::string> allowed = spellings<E>();
  const std::string spelt = parse_enum(key, text, allowed);
  for (std::size_t i = 0; i < allowed.size(); ++i)
    if (allowed[i] == spelt) return static_cast<E>(i);
  throw UsageError(fmt::format("bad value for {}: '{}'", key, text));   // unreachable: parse_enum threw
}

// An enumerated key: the field's enum type gives the allowed spellings.
template <class F>
DeckKey enum_key(std::string name, F field, std::string meaning) {
  using E = std::remove_cv_t<std::remove_reference_t<decltype(field(std::declval<Config&>()))>>;
  DeckKey k{name, "enum", std::move(meaning), spellings<E>(), "", {}, {}};
  k.set = [name, field](Config& c, const std::string& t) { field(c) = parse_deck_enum<E>(name, t); };
  k.get = [field](const Config& c) { return std::string(name_of(field(c))); };
  return k;
}

// Integer list; `allowed` (if not empty) restricts the items to those values.
template <class F>
DeckKey int_list_key(std::string name, F field, std::int64_t min, std::vector<std::int64_t> allowed, std::string meaning) {
  std::vector<std::string> allowed_text;
  for (auto a : allowed) allowed_text.push_back(fmt::format("{}", a));
  DeckKey k{name, "int-list", std::move(meaning), allowed_text, allowed.empty() ? fmt::format("each >= {}", min) : "", {}, {}};
  k.set = [name, field, min, allowed_text](Config& c, const std::string& t) {
    std::vector<std::int64_t> values;
    for (const auto& item : split_list(name, t)) {
      if (!allowed_text.empty()) parse_enum(name, item, allowed_text);
      values.push_back(parse_int(name, item, min));
    }
    field(c) = std::move(values);
  };
  k.get = [field](const Config& c) { return fmt::format("{}", fmt::join(field(c), ",")); };
  return k;
}

template <class F>
DeckKey enum_list_key(std::string name, F field, std::string meaning) {
  using List = std::remove_cv_t<std::remove_reference_t<decltype(field(std::declval<Config&>()))>>;
  using E = typename List::value_type;
  DeckKey k{name, "enum-list", std::move(meaning), spellings<E>(), "", {}, {}};
  k.set = [name, field](Config& c, const std::string& t) {
    List values;
    for (const auto& item : split_list(name, t)) values.push_back(parse_deck_enum<E>(name, item));
    field(c) = std::move(values);
  };
  k.get = [field](const Config& c) {
    std::vector<std::string_view> items;
    for (E e : field(c)) items.push_back(name_of(e));
    return fmt::format("{}", fmt::join(items, ","));
  };
  return k;
}

// A list of positive counts that may be empty (the empty text clears it).
template <class F>
DeckKey layer_counts_key(std::string name, F field, std::string meaning) {
  DeckKey k{name, "int-list", std::move(meaning), {}, "each >= 1; empty = none", {}, {}};
  k.set = [name, field](Config& c, const std::string& t) {
    std::vector<std::int64_t> values;
    if (!parse_string(t).empty())
      for (const auto& item : split_list(name, t)) values.push_back(parse_int(name, item, 1));
    field(c) = std::move(values);
  };
  k.get = [field](const Config& c) { return fmt::format("{}", fmt::join(field(c), ",")); };
  return k;
}

template <class F>
DeckKey bool_list_key(std::string name, F field, std::string meaning) {
  DeckKey k{name, "bool-list", std::move(meaning), {}, "", {}, {}};
  k.set = [name, field](Config& c, const std::string& t) {
    std::vector<bool> values;
    for (const auto& item : split_list(name, t)) values.push_back(parse_bool(name, item));
    field(c) = std::move(values);
  };
  k.get = [field](const Config& c) {
    std::vector<std::string> items;
    for (bool b : field(c)) items.push_back(b ? "true" : "false");
    return fmt::format("{}", fmt::join(items, ","));
  };
  return k;
}

// The [plan], [cluster] and [calibrate] keys (deck_keys_plan.cpp), after the others.
std::vector<DeckKey> plan_keys();

// A Config member as the accessor the builders take.
#define LMSCALE_FIELD(member) [](auto& c) -> auto& { return c.member; }

}  // namespace lmscale::io::detail
