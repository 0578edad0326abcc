#include "edit_distance.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <utility>

namespace lmscale::io::detail {

std::size_t edit_distance(const std::string& a, const std::string& b) {
  auto lower = [](char ch) { return static_cast<char>(std::tolower(static_cast<unsigned char>(ch))); };
  // One row of the dynamic-programming table at a time: row[j] = distance(a[0,i), b[0,j)).
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      const std::size_t substitute = diagonal + (lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}

namespace {
std::string last_component(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}
}  // namespace

std::optional<std::string> nearest_name(const std::string& name, const std::vector<std::string>& candidates) {
  // Rank by (distance, whole-name distance): the distance is the smaller of the whole-name
  // distance and the distance of the last components plus one (a key given in the wrong section,
  // or without one); ties, e.g. "trian.steps" vs bench.steps and train.steps, go to the candidate
  // whose whole name is closer.
  std::pair<std::size_t, std::size_t> best{std::numeric_limits<std::size_t>::max(), 0};
  const std::string* best_name = nullptr;
  const std::string tail = last_component(name);
  for (const auto& candidate : candidates) {
    const std::size_t whole = edit_distance(name, candidate);
    const std::size_t by_tail = edit_distance(tail, last_component(candidate)) + 1;
    const std::pair<std::size_t, std::size_t> rank{std::min(whole, by_tail), whole};
    if (rank < best) {
      best = rank;
      best_name = &candidate;
    }
  }
  if (best_name == nullptr) return std::nullopt;
  const std::size_t limit = std::max<std::size_t>(2, std::max(name.size(), best_name->size()) / 3);
  if (best.first > limit) return std::nullopt;
  return *best_name;
}

}  // namespace lmscale::io::detail
