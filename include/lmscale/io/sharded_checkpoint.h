#pragma once
// Sharded training checkpoints (docs/architecture.md §7, docs/checkpoints.md). A checkpoint is a directory
// DIR/step_NNNNNNNN/ holding
//   rank_RRRRR.h5  one per writing rank: float32 datasets `master`, `m`, `v` (the concatenated
//                  pieces this rank wrote: parameter values and AdamW moments) and a piece table
//                  `pieces/{name,begin,end,offset}`: elements [begin, end) of parameter `name`
//                  (row-major flat index) are at [offset, offset + end - begin) of the datasets.
//                  Datasets are chunked with Fletcher-32 checksums, so a damaged chunk fails to read.
//                  Per-rank training state other than the pieces under state/ (ShardWriter::write_state).
//   index.h5       written last, by rank 0, after every rank file is complete (as index.h5.tmp,
//                  then renamed): the training state's scalars as attributes (step, optimizer
//                  steps, loss scale, seed, data position, model shape, ...), the parameter list
//                  `params/{name,numel}`, the file list `files`, and every rank's piece table
//                  merged into `pieces/{file,param,begin,end,offset}`.
// A directory without index.h5 is incomplete and never loaded. Pieces of one parameter over all
// files are disjoint and cover it exactly once (checked when the index is written and read), so
// a reader finds any element range of any parameter by name, whatever layout wrote it.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lmscale/io/attr_value.h"

namespace lmscale::io {

inline constexpr const char* kShardSchema = "lmscale-checkpoint-shard/1";
inline constexpr const char* kIndexSchema = "lmscale-checkpoint-index/1";
inline constexpr const char* kIndexFile = "index.h5";
// The three float32 arrays of a rank file, in this order (StateKind indexes them).
enum class StateKind { master = 0, m = 1, v = 2 };
const char* state_kind_name(StateKind k);

// DIR/step_NNNNNNNN (8 digits, so names sort by step) and rank_RRRRR.h5.
std::string checkpoint_step_dir(const std::string& dir, std::int64_t step);
std::string shard_file_name(int rank);

struct ShardPiece {
  std::string name;                          // parameter name
  std::int64_t begin = 0, end = 0;           // element range within the parameter
  std::int64_t offset = 0;                   // first element in the rank file's arrays
};

// One rank's file: created as PATH.tmp (parent directories made), filled piece by piece, then
// committed (piece table and attributes written, renamed to PATH).
class ShardWriter {
 public:
  ShardWriter(const std::string& path, std::int64_t total_elements);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  void write(StateKind kind, std::int64_t offset, const float* data, std::int64_t count);
  // Further per-rank training state: a float32 array at state/<name> (name without '/'; the FP8
  // scaling state, jobs/engine/fp8_checkpoint_state.h).
  void write_state(const std::string& name, const std::vector<std::int64_t>& shape, const float* data);
  void commit(const std::vector<ShardPiece>& pieces, const std::map<std::string, AttrValue>& attrs);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class ShardReader {
 public:
  explicit ShardReader(const std::string& path);   // Error naming the file if it cannot be opened
  ~ShardReader();
  ShardReader(ShardReader&&) noexcept;
  std::vector<ShardPiece> pieces() const;
  // The file's root attributes (rank, world_size, step of the writer, schema).
  const std::map<std::string, AttrValue>& attrs() const;
  // Error naming the file when the range is outside the array or a checksum fails.
  void read(StateKind kind, std::int64_t offset, float* out, std::int64_t count) const;
  // write_state's array `name`: its shape (nullopt when the file has none), its values (Error
  // naming the file and both shapes when the shape differs).
  std::optional<std::vector<std::int64_t>> state_shape(const std::string& name) const;
  void read_state(const std::string& name, const std::vector<std::int64_t>& expected_shape, float* out) const;
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

struct CheckpointIndex {
  std::string dir;                                 // the step directory
  std::map<std::string, AttrValue> attrs;
  std::vector<std::string> files;                  // relative to dir
  std::vector<std::string> params;                 // names, in the writer's order
  std::vector<std::int64_t> numels;
  struct Entry {
    int file = 0, param = 0;
    std::int64_t begin = 0, end = 0, offset = 0;
  };
  std::vector<Entry> entries;                      // sorted by (param, begin)
  std::int64_t int_attr(const std::string& name) const;     // Error naming index.h5 if missing
  double double_attr(const std::string& name) const;
  int param_index(const std::string& name) const;          // -1 if absent
};

// Rank 0, after every rank committed its file: reads the `files` rank files' piece tables, checks
// that they cover each of `params` (name, numel) exactly once, writes STEP_DIR/index.h5.
void write_index(const std::string& step_dir, int files, const std::vector<std::pair<std::string, std::int64_t>>& params,
                 const std::map<std::string, AttrValue>& attrs);
// Reads and checks STEP_DIR/index.h5 (schema, coverage); Error naming the file and the problem.
CheckpointIndex read_index(const std::string& step_dir);

// Complete checkpoints (step directories with an index) under DIR, by ascending step.
std::vector<std::pair<std::int64_t, std::string>> complete_checkpoints(const std::string& dir);
// Removes every step directory under DIR older than the newest `keep` complete ones (incomplete
// ones included: they are left by runs that stopped while writing). keep <= 0 keeps all.
void prune_checkpoints(const std::string& dir, std::int64_t keep);

// Moves every step directory under DIR whose step exceeds `step` (complete or not) into a new
// DIR/superseded-<UTC time, YYYYmmddTHHMMSSZ>/ (train.on_newer_checkpoints = move-aside); returns
// that folder and the names moved, or an empty folder when nothing is newer. Error naming the
// folder when a rename fails (what was moved stays moved).
struct MovedAside {
  std::string folder;
  std::vector<std::string> names;
};
MovedAside move_aside_newer_checkpoints(const std::string& dir, std::int64_t step);

// What in the index contradicts a model of these dimensions (vocab_size, d_model, d_ff,
// num_layers, num_heads), as one sentence; nullopt when they agree.
std::optional<std::string> model_mismatch(const CheckpointIndex& index, const std::map<std::string, std::int64_t>& dims);

}  // namespace lmscale::io
