// Sharded checkpoint files (io/sharded_checkpoint.h): pieces round-trip by name and range, the
// index refuses pieces that overlap or leave a gap, and pruning keeps the newest complete ones.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <vector>

#include "lmscale/core/error.h"
#include "lmscale/io/sharded_checkpoint.h"

namespace fs = std::filesystem;
using namespace lmscale;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("lmscale_shard_" + std::to_string(::getpid()) + "_" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
};

// One rank file holding `pieces` of a parameter "w"; values = element index + 1000 * kind.
void write_rank(const std::string& dir, int rank, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
  std::int64_t total = 0;
  std::vector<io::ShardPiece> table;
  for (auto [b, e] : ranges) {
    table.push_back({"w", b, e, total});
    total += e - b;
  }
  io::ShardWriter w((fs::path(dir) / io::shard_file_name(rank)).string(), total);
  for (const auto& p : table)
    for (int k = 0; k < 3; ++k) {
      std::vector<float> v(static_cast<std::size_t>(p.end - p.begin));
      std::iota(v.begin(), v.end(), static_cast<float>(p.begin + 1000 * k));
      w.write(static_cast<io::StateKind>(k), p.offset, v.data(), p.end - p.begin);
    }
  w.commit(table, {{"rank", std::int64_t{rank}}});
}

}  // namespace

TEST(ShardedCheckpoint, PiecesRoundTripThroughTheIndex) {
  TempDir t;
  const std::string dir = io::checkpoint_step_dir(t.path.string(), 7);
  EXPECT_EQ(fs::path(dir).filename(), "step_00000007");
  write_rank(dir, 0, {{0, 5}});
  write_rank(dir, 1, {{5, 12}});
  io::write_index(dir, 2, {{"w", 12}}, {{"step", std::int64_t{7}}});
  const io::CheckpointIndex ix = io::read_index(dir);
  EXPECT_EQ(ix.int_attr("step"), 7);
  ASSERT_EQ(ix.entries.size(), 2u);
  EXPECT_EQ(ix.entries[1].file, 1);
  EXPECT_EQ(ix.entries[1].begin, 5);
  const io::ShardReader r((fs::path(dir) / ix.files[1]).string());
  std::vector<float> v(3);
  r.read(io::StateKind::v, 2, v.data(), 3);   // elements 7..9 of w, moment v
  EXPECT_EQ(v, (std::vector<float>{2007, 2008, 2009}));
  EXPECT_THROW(r.read(io::StateKind::m, 5, v.data(), 3), Error);   // past the file's 7 elements
  EXPECT_EQ(io::complete_checkpoints(t.path.string()).size(), 1u);
}

// A rank file's further state (ShardWriter::write_state: delayed FP8 scaling's histories) reads
// back with its shape; an absent name has none, and a shape mismatch throws.
TEST(ShardedCheckpoint, StateArraysRoundTripInTheRankFile) {
  TempDir t;
  const std::string path = (t.path / io::shard_file_name(3)).string();
  const std::vector<float> history{1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  {
    io::ShardWriter w(path, 0);
    w.write_state("fp8_amax_history", {3, 2}, history.data());
    EXPECT_THROW(w.write_state("a/b", {1}, history.data()), Error);
    w.commit({}, {{"rank", std::int64_t{3}}});
  }
  const io::ShardReader r(path);
  EXPECT_EQ(r.state_shape("fp8_amax_history"), (std::vector<std::int64_t>{3, 2}));
  EXPECT_FALSE(r.state_shape("fp8_scale").has_value());
  std::vector<float> got(6);
  r.read_state("fp8_amax_history", {3, 2}, got.data());
  EXPECT_EQ(got, history);
  EXPECT_THROW(r.read_state("fp8_amax_history", {2, 3}, got.data()), Error);
  EXPECT_THROW(r.read_state("fp8_scale", {3}, got.data()), Error);
}

TEST(ShardedCheckpoint, IndexRefusesOverlapsAndGaps) {
  TempDir t;
  const std::string overlap = io::checkpoint_step_dir(t.path.string(), 1);
  write_rank(overlap, 0, {{0, 6}});
  write_rank(overlap, 1, {{5, 12}});
  EXPECT_THROW(io::write_index(overlap, 2, {{"w", 12}}, {}), Error);
  const std::string gap = io::checkpoint_step_dir(t.path.string(), 2);
  write_rank(gap, 0, {{0, 5}});
  write_rank(gap, 1, {{6, 12}});
  EXPECT_THROW(io::write_index(gap, 2, {{"w", 12}}, {}), Error);
  // Neither became complete.
  EXPECT_TRUE(io::complete_checkpoints(t.path.string()).empty());
  EXPECT_THROW(io::read_index(gap), Error);
}

TEST(ShardedCheckpoint, PruneKeepsTheNewestCompleteOnes) {
  TempDir t;
  for (std::int64_t step : {2, 4, 6, 8}) {
    const std::string dir = io::checkpoint_step_dir(t.path.string(), step);
    write_rank(dir, 0, {{0, 3}});
    if (step != 8) io::write_index(dir, 1, {{"w", 3}}, {});   // step 8: incomplete, newer than all
  }
  io::prune_checkpoints(t.path.string(), 2);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(t.path)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  // Steps 4 and 6 are the newest complete; the incomplete step 8 is newer, so it stays too.
  EXPECT_EQ(left, (std::vector<std::string>{"step_00000004", "step_00000006", "step_00000008"}));
}
