#pragma once
// Real text without a tokenizer (data.source = text): every byte of a UTF-8 file is one token
// (ids 0..255, so model.vocab_size must be >= 256). The validation split is the file's tail
// (data.val_fraction of its bytes), or the whole of data.val_path when given. Sample offsets are
// drawn like the token files' (counter-based from (seed, step, global sample index)), so every
// rank layout sees the same global batch.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lmscale/io/dataset.h"

namespace lmscale::io {

// Byte offset of the first byte that does not start or continue a valid UTF-8 sequence
// (overlong forms, surrogates and code points above U+10FFFF are invalid); n when all is valid.
std::size_t utf8_invalid_offset(const unsigned char* data, std::size_t n);

// Entropy in nats of the byte histogram of data[0, n): the loss of the best model that ignores
// context (a unigram model), the bar a trained model's loss must fall below.
double unigram_entropy(const unsigned char* data, std::size_t n);

class TextBytes final : public TokenSource {
 public:
  // Reads `path` (and `val_path` when not empty) into memory.
  TextBytes(const std::string& path, const std::string& val_path, double val_fraction, std::uint64_t seed);
  void sample(std::uint64_t step, std::int64_t first, std::int64_t rows, std::int64_t T, std::int32_t* out,
              bool eval) const override;
  std::string describe() const override;
  std::map<std::string, double> attributes() const override;
  std::size_t train_bytes() const { return train_end_; }
  std::size_t val_bytes() const;
  double entropy() const { return entropy_; }   // unigram entropy of the training part (nats/byte)

 private:
  std::string path_, val_path_;
  std::vector<unsigned char> text_, val_text_;   // val_text_ empty: validation = tail of text_
  std::size_t train_end_ = 0;                    // training bytes [0, train_end_) of text_
  std::uint64_t seed_;
  double entropy_ = 0;
};

// Deck validation of a text file (exit 2 before any work): a regular, non-empty file of valid
// UTF-8 whose training part and validation part each hold at least `min_bytes` bytes. Throws
// UsageError naming `key`, the file and the fix.
void check_text_file(const std::string& key, const std::string& path, double val_fraction, std::int64_t min_bytes);

}  // namespace lmscale::io
