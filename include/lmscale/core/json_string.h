#pragma once
// A string as a JSON string literal, quotes included: ", \ and the control characters escaped
// (\n, \r, \t by name, the others as \u00XX); other bytes, UTF-8 included, pass through. Shared by
// every JSON writer (traces, the metrics stream, safetensors headers).
#include <string>
#include <string_view>

namespace lmscale {

std::string json_string(std::string_view s);

}  // namespace lmscale
