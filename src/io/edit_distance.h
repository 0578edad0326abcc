#pragma once
// Nearest-name suggestions for misspelt deck keys and checkpoint parameter names
// ("did you mean 'model.d_model'?").
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace lmscale::io::detail {

// Levenshtein distance (insert, delete, substitute: cost 1 each), ignoring ASCII case.
std::size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `name`. Dotted names ("section.key") are also compared by their last
// component, so "d_model" alone finds "model.d_model". Nothing when even the nearest candidate
// differs in more than about a third of its characters: such a suggestion would mislead.
std::optional<std::string> nearest_name(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace lmscale::io::detail
