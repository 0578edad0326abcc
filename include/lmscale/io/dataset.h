#pragma once
// Token sources for training and evaluation. A batch is addressed by (step, global sample
// index), never by rank, so every data-parallel layout sees the same global batch: rank r of N
// asks for samples [r*B/N, (r+1)*B/N) of each global batch (docs/architecture.md §6).
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "lmscale/io/config.h"

namespace lmscale::io {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes `rows` sequences of T+1 tokens (inputs are the first T, targets the last T) for global
  // samples [first, first+rows) of batch `step` into out[rows*(T+1)]. eval selects the held-out
  // stream.
  virtual void sample(std::uint64_t step, std::int64_t first, std::int64_t rows, std::int64_t T, std::int32_t* out,
                      bool eval) const = 0;
  virtual std::string describe() const = 0;
  // Facts about the data worth keeping beside the run (written as /train attributes data_NAME),
  // e.g. the text source's unigram entropy.
  virtual std::map<std::string, double> attributes() const { return {}; }
};

// Synthetic text with learnable structure: each next token is succ(prev) = (prev*7919 + 1237) mod V
// with probability 3/4 and uniform otherwise. A model that learns succ reaches the process's
// entropy (entropy(): 2.9 nats for V=10000), far below the ln(V) = 9.2 of a uniform guess.
class SyntheticTokens final : public TokenSource {
 public:
  SyntheticTokens(std::int64_t vocab, std::uint64_t seed) : vocab_(vocab), seed_(seed) {}
  void sample(std::uint64_t step, std::int64_t first, std::int64_t rows, std::int64_t T, std::int32_t* out,
              bool eval) const override;
  std::string describe() const override;
  // The loss (nats/token) of the best predictor of this process: a floor for training curves.
  double entropy() const;

 private:
  std::int64_t vocab_;
  std::uint64_t seed_;
};

// A flat file of little-endian uint16 or uint32 token ids (as numpy's tofile writes them), read
// with pread (no memory map: a file truncated under the run is an Error naming it, not a SIGBUS);
// each sample starts at a random offset drawn from (seed, step, index) within the size the file
// had when it was opened.
class TokenFile final : public TokenSource {
 public:
  TokenFile(const std::string& path, const std::string& val_path, TokenDtype dtype, std::int64_t vocab,
            std::uint64_t seed);
  ~TokenFile() override;
  void sample(std::uint64_t step, std::int64_t first, std::int64_t rows, std::int64_t T, std::int32_t* out,
              bool eval) const override;
  std::string describe() const override;

 private:
  struct File {
    int fd = -1;
    std::size_t bytes = 0;   // when opened
    std::string key;         // data.path or data.val_path
    std::string path;
  };
  static File open_file(const std::string& key, const std::string& path);
  File train_, val_;
  int width_;   // bytes per token
  std::int64_t vocab_;
  std::uint64_t seed_;
};

// Validates a token file before any work (deck validation, exit 2 on failure): a regular file,
// a whole number of `dtype` elements, at least `min_tokens` of them, and every id < `vocab` (one
// pass over the file in blocks, a few GB/s). Throws UsageError naming `key` (data.path or
// data.val_path), the file and the fix.
void check_token_file(const std::string& key, const std::string& path, TokenDtype dtype, std::int64_t vocab,
                      std::int64_t min_tokens);

std::unique_ptr<TokenSource> make_token_source(const DataConfig& cfg, std::int64_t vocab, std::uint64_t seed);

}  // namespace lmscale::io
