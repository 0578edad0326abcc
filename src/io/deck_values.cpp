#include "deck_values.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lmscale/core/error.h"

namespace lmscale::io::detail {

namespace {

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

[[noreturn]] void bad_value(const std::string& key, const std::string& text, const std::string& why) {
  throw UsageError(fmt::format("bad value for {}: '{}' {}", key, text, why));
}

// Whole text must be one integer; nothing when it is not (or overflows).
std::optional<std::int64_t> to_int64(const std::string& t) {
  std::int64_t v = 0;
  const char* first = t.data();
  if (!t.empty() && t[0] == '+') ++first;
  const auto [ptr, ec] = std::from_chars(first, t.data() + t.size(), v);
  if (ec != std::errc() || ptr != t.data() + t.size() || first == t.data() + t.size()) return std::nullopt;
  return v;
}

}  // namespace

bool FloatRange::contains(double x) const {
  const bool above = min_inclusive ? x >= min : x > min;
  const bool below = max_inclusive ? x <= max : x < max;
  return above && below;
}

std::string FloatRange::describe() const {
  const bool has_min = min > -1e308, has_max = max < 1e308;
  if (has_min && has_max)
    return fmt::format("in {}{}, {}{}", min_inclusive ? '[' : '(', min, max, max_inclusive ? ']' : ')');
  if (has_min) return fmt::format("{} {}", min_inclusive ? ">=" : ">", min);
  if (has_max) return fmt::format("{} {}", max_inclusive ? "<=" : "<", max);
  return "";
}

std::string trim(const std::string& s) {
  const auto is_space = [](char ch) { return std::isspace(static_cast<unsigned char>(ch)) != 0; };
  auto b = std::find_if_not(s.begin(), s.end(), is_space);
  auto e = std::find_if_not(s.rbegin(), s.rend(), is_space).base();
  return b < e ? std::string(b, e) : std::string();
}

std::string parse_string(const std::string& text, const std::string& key) {
  std::string t = trim(text);
  if (t.size() >= 2 && t.front() == '"' && t.back() == '"') return t.substr(1, t.size() - 2);
  if (!t.empty() && (t.front() == '"' || t.back() == '"'))
    bad_value(key.empty() ? std::string("a key") : key, text,
              "has an unbalanced double quote; close the quote (\"...\") or remove it");
  return t;
}

std::int64_t parse_int(const std::string& key, const std::string& text, std::int64_t min) {
  const std::string t = trim(text);
  const auto v = to_int64(t);
  if (!v) bad_value(key, text, fmt::format("is not a whole number (expected an integer >= {})", min));
  if (*v < min) bad_value(key, text, fmt::format("is too small (expected an integer >= {})", min));
  return *v;
}

std::uint64_t parse_uint(const std::string& key, const std::string& text) {
  const std::string t = trim(text);
  std::uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || ptr != t.data() + t.size())
    bad_value(key, text, "is not a whole number (expected an integer in [0, 2^64))");
  return v;
}

std::int64_t parse_bytes(const std::string& key, const std::string& text, std::int64_t min) {
  std::string t = trim(text);
  std::int64_t scale = 1;
  const std::string l = lower(t);
  static constexpr std::pair<const char*, std::int64_t> kSuffixes[] = {
      {"kib", 1LL << 10}, {"mib", 1LL << 20}, {"gib", 1LL << 30}, {"k", 1LL << 10}, {"m", 1LL << 20}, {"g", 1LL << 30}};
  for (const auto& [suffix, factor] : kSuffixes) {
    const std::string s(suffix);
    if (l.size() > s.size() && l.compare(l.size() - s.size(), s.size(), s) == 0) {
      t = trim(t.substr(0, t.size() - s.size()));
      scale = factor;
      break;
    }
  }
  const auto v = to_int64(t);
  const std::string expected = fmt::format("expected a byte count >= {}, optionally with suffix K, M or G", min);
  if (!v) bad_value(key, text, fmt::format("is not a byte count ({})", expected));
  if (*v > std::numeric_limits<std::int64_t>::max() / scale || *v < 0)
    bad_value(key, text, fmt::format("is out of range ({})", expected));
  if (*v * scale < min) bad_value(key, text, fmt::format("is too small ({})", expected));
  return *v * scale;
}

double parse_float(const std::string& key, const std::string& text, const FloatRange& range) {
  const std::string t = trim(text);
  double v = 0;
  const char* first = t.data();
  if (!t.empty() && t[0] == '+') ++first;
  const auto [ptr, ec] = std::from_chars(first, t.data() + t.size(), v);
  const std::string expected = range.describe().empty() ? "a number" : "a number " + range.describe();
  if (t.empty() || ec != std::errc() || ptr != t.data() + t.size() || !std::isfinite(v))
    bad_value(key, text, fmt::format("is not a finite number (expected {})", expected));
  if (!range.contains(v)) bad_value(key, text, fmt::format("is out of range (expected {})", expected));
  return v;
}

bool parse_bool(const std::string& key, const std::string& text) {
  const std::string t = lower(trim(text));
  if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return false;
  bad_value(key, text, "is not a boolean (expected true/false, 1/0, yes/no or on/off)");
}

std::string parse_enum(const std::string& key, const std::string& text, const std::vector<std::string>& allowed) {
  const std::string t = lower(parse_string(text, key));
  for (const auto& a : allowed)
    if (lower(a) == t) return a;
  bad_value(key, text, fmt::format("is not allowed (expected one of: {})", fmt::join(allowed, ", ")));
}

std::vector<std::string> split_list(const std::string& key, const std::string& text) {
  const std::string t = parse_string(text, key);
  if (t.empty()) bad_value(key, text, "is an empty list (expected comma-separated values, e.g. 128,256)");
  std::vector<std::string> items;
  std::size_t start = 0;
  while (true) {
    const auto comma = t.find(',', start);
    std::string item = trim(t.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (item.empty()) bad_value(key, text, "has an empty list item (expected comma-separated values, e.g. 128,256)");
    items.push_back(std::move(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

}  // namespace lmscale::io::detail
