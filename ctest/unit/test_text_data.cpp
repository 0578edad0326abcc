// data.source = text (io/text_data.h): UTF-8 validation, the unigram entropy, the tail split,
// layout-independent sampling, and the deck-time file checks (exit 2 messages).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "lmscale/core/error.h"
#include "lmscale/io/text_data.h"

using namespace lmscale;
using namespace lmscale::io;

namespace {

std::size_t bad(const std::string& s) {
  return utf8_invalid_offset(reinterpret_cast<const unsigned char*>(s.data()), s.size());
}

std::string temp_file(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / ("lmscale_text_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

}  // namespace

TEST(Utf8, ValidAndInvalidSequences) {
  EXPECT_EQ(bad("plain ASCII"), 11u);
  EXPECT_EQ(bad("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), 14u);   // é, €, 😀
  EXPECT_EQ(bad("ab\xFF"), 2u);                  // never in UTF-8
  EXPECT_EQ(bad("ab\xC0\xAF"), 2u);              // overlong '/'
  EXPECT_EQ(bad("a\xE0\x80\xAF"), 1u);           // overlong 3-byte
  EXPECT_EQ(bad("a\xED\xA0\x80"), 1u);           // surrogate U+D800
  EXPECT_EQ(bad("a\xF4\x90\x80\x80"), 1u);       // above U+10FFFF
  EXPECT_EQ(bad("abc\xC3"), 3u);                 // truncated at the end
  EXPECT_EQ(bad("ab\x80"), 2u);                  // lone continuation byte
  EXPECT_EQ(bad("a\xE2\x82z"), 1u);              // bad continuation
}

TEST(TextData, UnigramEntropy) {
  const std::string two = "abab";
  EXPECT_NEAR(unigram_entropy(reinterpret_cast<const unsigned char*>(two.data()), two.size()), std::log(2.0), 1e-15);
  const std::string one = "aaaa";
  EXPECT_EQ(unigram_entropy(reinterpret_cast<const unsigned char*>(one.data()), one.size()), 0.0);
  const std::string skew = "aaab";   // -(3/4 ln 3/4 + 1/4 ln 1/4)
  EXPECT_NEAR(unigram_entropy(reinterpret_cast<const unsigned char*>(skew.data()), skew.size()),
              -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)), 1e-15);
}

TEST(TextData, TailSplitAndLayoutIndependentSamples) {
  // 900 bytes of 'a'..'y' then a 100-byte tail of 'Z': with val_fraction 0.1 the training samples
  // never see 'Z' and the evaluation samples see nothing else.
  std::string text;
  for (int i = 0; i < 900; ++i) text += static_cast<char>('a' + i % 25);
  text += std::string(100, 'Z');
  const auto path = temp_file("split.txt", text);
  const TextBytes data(path, "", 0.1, 42);
  EXPECT_EQ(data.train_bytes(), 900u);
  EXPECT_EQ(data.val_bytes(), 100u);
  EXPECT_NEAR(data.entropy(), std::log(25.0), 1e-12);
  const std::int64_t T = 16, B = 8;
  std::vector<std::int32_t> all(B * (T + 1)), half(B * (T + 1));
  for (std::uint64_t step = 0; step < 20; ++step) {
    data.sample(step, 0, B, T, all.data(), false);
    for (auto t : all) ASSERT_NE(t, 'Z');
    // Rank 1 of 2 asks for rows [4, 8): the same rows as the one-process batch.
    data.sample(step, 4, 4, T, half.data(), false);
    for (std::int64_t i = 0; i < 4 * (T + 1); ++i) ASSERT_EQ(half[i], all[4 * (T + 1) + i]);
    data.sample(step, 0, B, T, all.data(), true);
    for (auto t : all) ASSERT_EQ(t, 'Z');
  }
  // Consecutive bytes of the file (inputs and shifted targets come from one window).
  data.sample(3, 0, 1, T, all.data(), false);
  for (std::int64_t t = 1; t <= T; ++t) EXPECT_EQ(all[t] - 'a', (all[t - 1] - 'a' + 1) % 25);
  std::filesystem::remove(path);
}

TEST(TextData, DeckChecksNameTheFile) {
  auto message = [](const std::string& path, double frac, std::int64_t min) {
    try {
      check_text_file("data.path", path, frac, min);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto empty = temp_file("empty.txt", "");
  EXPECT_NE(message(empty, 0.1, 10).find("is empty"), std::string::npos);
  EXPECT_NE(message(empty, 0.1, 10).find(empty), std::string::npos);
  const auto binary = temp_file("binary.txt", std::string("hello world, this is text\xFF\xFE more"));
  const auto m = message(binary, 0.0, 10);
  EXPECT_NE(m.find("not valid UTF-8"), std::string::npos) << m;
  EXPECT_NE(m.find("byte 25"), std::string::npos) << m;
  const auto small = temp_file("small.txt", std::string(50, 'x'));
  EXPECT_NE(message(small, 0.0, 60).find("context_length"), std::string::npos);
  EXPECT_NE(message(small, 0.1, 10).find("validation tail"), std::string::npos);   // 5 bytes < 10
  EXPECT_EQ(message(small, 0.5, 10), "");
  EXPECT_NE(message("/nonexistent/file.txt", 0.1, 10).find("cannot be opened"), std::string::npos);
  for (const auto& p : {empty, binary, small}) std::filesystem::remove(p);
}
