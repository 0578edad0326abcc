#pragma once
// Parsing one deck value from its text. Every function throws UsageError whose message names the
// key, quotes the bad text and says what is expected, e.g.
//   "bad value for model.d_model: '51x2' is not a whole number (expected an integer >= 1)".
#include <cstdint>
#include <string>
#include <vector>

namespace lmscale::io::detail {

// A closed or half-open interval for floating-point keys; shown in --help as e.g. "> 0".
struct FloatRange {
  double min = -1e308, max = 1e308;
  bool min_inclusive = true, max_inclusive = true;
  static FloatRange any() { return {}; }
  static FloatRange positive() { return {0.0, 1e308, false, true}; }
  static FloatRange non_negative() { return {0.0, 1e308, true, true}; }
  static FloatRange unit_open_right() { return {0.0, 1.0, true, false}; }   // [0, 1)
  bool contains(double x) const;
  std::string describe() const;   // "> 0", ">= 0", "in [0, 1)", "" for any
};

std::string trim(const std::string& s);

std::int64_t parse_int(const std::string& key, const std::string& text, std::int64_t min);
std::uint64_t parse_uint(const std::string& key, const std::string& text);
// Byte counts: an integer with an optional binary suffix K, M, G (KiB, MiB, GiB also accepted).
std::int64_t parse_bytes(const std::string& key, const std::string& text, std::int64_t min);
double parse_float(const std::string& key, const std::string& text, const FloatRange& range);
// true/false, 1/0, yes/no, on/off (any case).
bool parse_bool(const std::string& key, const std::string& text);
// One of `allowed`, matched ignoring case; returns the allowed spelling.
std::string parse_enum(const std::string& key, const std::string& text, const std::vector<std::string>& allowed);
// "a,b,c" -> {"a","b","c"}, items trimmed; an empty list or an empty item is an error.
std::vector<std::string> split_list(const std::string& key, const std::string& text);

// Plain strings and paths: surrounding double quotes are removed ("a b" -> a b). A quote that opens
// without closing (or closes without opening) is an error naming `key` (issue 36: it used to become
// part of a file name).
std::string parse_string(const std::string& text, const std::string& key = "");

}  // namespace lmscale::io::detail
