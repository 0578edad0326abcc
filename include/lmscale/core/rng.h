#pragma once
// Deterministic, counter-based random numbers. A stream is named by (seed, key) and element i of
// it is a pure function of (seed, key, i), so any shard of a tensor can be filled on any rank with
// the same values a single process would produce (independent of rank count and layout).
#include <cstdint>
#include <string_view>

namespace lmscale {

__extension__ typedef unsigned __int128 uint128_t;

std::uint64_t hash_name(std::string_view name);   // FNV-1a 64
std::uint64_t splitmix64(std::uint64_t x);

class CounterRng {
 public:
  CounterRng(std::uint64_t seed, std::uint64_t key) : base_(splitmix64(seed ^ splitmix64(key + 0x9e3779b97f4a7c15ull))) {}
  // 64 random bits for (index, draw).
  std::uint64_t bits(std::uint64_t index, std::uint32_t draw = 0) const {
    return splitmix64(base_ ^ splitmix64(index * 0x9e3779b97f4a7c15ull + draw));
  }
  // Uniform in (0, 1).
  double uniform(std::uint64_t index, std::uint32_t draw = 0) const {
    return (static_cast<double>(bits(index, draw) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
  // Standard normal (Box-Muller on two uniforms).
  double normal(std::uint64_t index, std::uint32_t draw = 0) const;
  // Normal(0, std) truncated to [-clip*std, clip*std] by rejection (same law as torch trunc_normal_).
  double truncated_normal(std::uint64_t index, double std, double clip) const;
  // Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t index, std::uint64_t n, std::uint32_t draw = 0) const {
    return static_cast<std::uint64_t>((static_cast<uint128_t>(bits(index, draw)) * n) >> 64);
  }

 private:
  std::uint64_t base_;
};

}  // namespace lmscale
