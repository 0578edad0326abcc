#pragma once
// Minimal JSON for the small headers lmscale writes and reads itself: results files'
// `attribute_units` (an object of strings) and safetensors headers (safetensors_file.cpp). Not a
// general JSON library: the parser takes objects, arrays, strings, integers and the literals, and
// rejects what it does not take with a message that says where.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lmscale::io::json {

// `s` as a JSON string literal, quotes included (", \ and control characters escaped).
std::string quote(std::string_view s);

// A parsed value. Numbers are integers only (safetensors' shapes and offsets); a number with a
// fraction or exponent is a parse error.
struct Value {
  enum class Kind { null, boolean, integer, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  std::int64_t integer = 0;
  std::string string;
  std::vector<Value> array;
  std::vector<std::pair<std::string, Value>> object;   // in the order of the text
  const Value* find(std::string_view key) const;        // object member, or nullptr
};

// Parses one JSON value filling the whole of `text` (whitespace around it allowed). Throws Error
// "JSON: <what> at byte N" for anything else, including duplicate object keys and nesting deeper
// than 16 levels.
Value parse(std::string_view text);

}  // namespace lmscale::io::json
