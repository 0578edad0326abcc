// The [model] keys a checkpoint or weights file records, against the deck's (issue 36 item 6):
// every key that changes the function the weights compute must match on resume, not only the
// ones whose shapes happen to be read. context_length, attention, attention_deterministic and
// ce_chunk_rows are left out on purpose: the same weights compute the same function of each
// position under any of them (RoPE is relative; the others choose a kernel or a chunking).
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <variant>

#include <fmt/format.h>

#include "deck_validate.h"

namespace lmscale::io::detail {

namespace {

// The [model] section of the resolved deck text (attribute `config`, written by every train run
// into checkpoints, weights files and safetensors metadata): key -> value text.
std::map<std::string, std::string> model_section_of(const std::map<std::string, AttrValue>& attrs) {
  std::map<std::string, std::string> out;
  const auto it = attrs.find("config");
  if (it == attrs.end() || !std::holds_alternative<std::string>(it->second)) return out;
  std::istringstream in(std::get<std::string>(it->second));
  std::string line, section;
  auto trim = [](std::string s) {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.pop_back();
    while (!s.empty() && s.front() == ' ') s.erase(s.begin());
    return s;
  };
  while (std::getline(in, line)) {
    if (!line.empty() && line.front() == '[') section = trim(line);
    const auto eq = line.find('=');
    if (section != "[model]" || eq == std::string::npos) continue;
    out[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return out;
}

// A recorded value as text and as a number. Safetensors metadata holds every attribute as text,
// HDF5 as an integer or a double; the `config` text is the fallback (files written before an
// attribute of its own existed).
struct Recorded {
  std::string text;
  double value = 0;
};

std::optional<Recorded> recorded(const std::map<std::string, AttrValue>& attrs,
                                 const std::map<std::string, std::string>& model_section, const std::string& key) {
  std::string text;
  if (const auto it = attrs.find(key); it != attrs.end()) {
    if (const auto* i = std::get_if<std::int64_t>(&it->second)) return Recorded{fmt::format("{}", *i), double(*i)};
    if (const auto* d = std::get_if<double>(&it->second)) return Recorded{fmt::format("{}", *d), *d};
    if (const auto* s = std::get_if<std::string>(&it->second)) text = *s;
  }
  if (text.empty())
    if (const auto it = model_section.find(key); it != model_section.end()) text = it->second;
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0') return std::nullopt;   // not a number: nothing to compare
  return Recorded{text, v};
}

}  // namespace

std::optional<std::string> recorded_model_mismatch(const ModelConfig& m, const std::map<std::string, AttrValue>& attrs) {
  const auto section = model_section_of(attrs);
  // In the order a reader fixes them: sizes first, then the keys no shape shows.
  const std::pair<const char*, double> keys[] = {
      {"vocab_size", double(m.vocab_size)}, {"d_model", double(m.d_model)},     {"d_ff", double(m.d_ff)},
      {"num_layers", double(m.num_layers)}, {"num_heads", double(m.num_heads)}, {"rope_theta", m.rope_theta},
      {"norm_eps", m.norm_eps}};
  for (const auto& [key, deck] : keys) {
    const auto r = recorded(attrs, section, key);
    if (!r || r->value == deck) continue;
    return fmt::format("it was written with model.{} = {} but the deck has {} (set model.{} = {})", key, r->text, deck,
                       key, r->text);
  }
  return std::nullopt;
}

}  // namespace lmscale::io::detail
