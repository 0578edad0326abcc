// HDF5 results files (io/results.h): provenance, tables, units, attributes, arrays, the .tmp
// convention, a crash leaving flushed rows readable, and inactive (non-zero rank) files. Read
// back with the HDF5 C API, independently of the writer's code.
#include <gtest/gtest.h>

#include "temp_dir.h"

#include <hdf5.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "lmscale/core/cpu_model.h"
#include "lmscale/core/error.h"
#include "lmscale/io/deck.h"
#include "lmscale/io/result_units.h"
#include "lmscale/io/results.h"
#include "lmscale/version.h"

namespace {

namespace fs = std::filesystem;
using lmscale::io::Column;
using lmscale::io::ResultsFile;
using lmscale::io::Row;
using lmscale::io::Table;
using T = Column::Type;

using lmscale::test::TempDir;

// --- independent readers (C API only) ---

std::string read_string_attr(hid_t obj, const char* name) {
  const hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
  EXPECT_GE(attr, 0) << name;
  const hid_t type = H5Aget_type(attr);
  std::string result;
  if (H5Tis_variable_str(type) > 0) {
    char* text = nullptr;
    const hid_t mem = H5Tcopy(H5T_C_S1);
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5T_CSET_UTF8);
    EXPECT_GE(H5Aread(attr, mem, &text), 0);
    result = text;
    H5free_memory(text);
    H5Tclose(mem);
  } else {
    ADD_FAILURE() << name << " is not a variable-length string";
  }
  H5Tclose(type);
  H5Aclose(attr);
  return result;
}

std::int64_t read_int_attr(hid_t obj, const char* name) {
  const hid_t attr = H5Aopen(obj, name, H5P_DEFAULT);
  std::int64_t v = -1;
  EXPECT_GE(H5Aread(attr, H5T_NATIVE_INT64, &v), 0);
  H5Aclose(attr);
  return v;
}

// A 1-D attribute of variable-length UTF-8 strings (e.g. `units`).
std::vector<std::string> read_units(hid_t dataset) {
  const hid_t attr = H5Aopen(dataset, "units", H5P_DEFAULT);
  const hid_t type = H5Aget_type(attr);
  const hid_t space = H5Aget_space(attr);
  EXPECT_EQ(H5Tget_class(type), H5T_STRING);
  EXPECT_GT(H5Tis_variable_str(type), 0);
  EXPECT_EQ(H5Tget_cset(type), H5T_CSET_UTF8);
  const auto n = static_cast<std::size_t>(H5Sget_simple_extent_npoints(space));
  std::vector<char*> buffer(n, nullptr);
  EXPECT_GE(H5Aread(attr, type, buffer.data()), 0);
  std::vector<std::string> units;
  for (char* u : buffer) {
    units.emplace_back(u ? u : "");
    H5free_memory(u);
  }
  H5Sclose(space);
  H5Tclose(type);
  H5Aclose(attr);
  return units;
}

struct StepRow {
  std::int64_t step;
  double loss;
  std::string phase;
};

// Reads /train/steps-like tables {step i64, loss f64, phase vlen UTF-8 string} by field name;
// the file's string field must be variable-length UTF-8.
std::vector<StepRow> read_steps(hid_t file, const char* path) {
  struct Packed {
    std::int64_t step;
    double loss;
    char* phase;
  };
  const hid_t dataset = H5Dopen2(file, path, H5P_DEFAULT);
  EXPECT_GE(dataset, 0) << path;
  const hid_t file_type = H5Dget_type(dataset);
  const hid_t phase_type = H5Tget_member_type(file_type, static_cast<unsigned>(H5Tget_member_index(file_type, "phase")));
  EXPECT_GT(H5Tis_variable_str(phase_type), 0);
  EXPECT_EQ(H5Tget_cset(phase_type), H5T_CSET_UTF8);
  H5Tclose(phase_type);
  H5Tclose(file_type);
  const hid_t space = H5Dget_space(dataset);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  const hid_t str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, H5T_VARIABLE);
  H5Tset_cset(str, H5T_CSET_UTF8);
  const hid_t mem = H5Tcreate(H5T_COMPOUND, sizeof(Packed));
  H5Tinsert(mem, "step", HOFFSET(Packed, step), H5T_NATIVE_INT64);
  H5Tinsert(mem, "loss", HOFFSET(Packed, loss), H5T_NATIVE_DOUBLE);
  H5Tinsert(mem, "phase", HOFFSET(Packed, phase), str);
  std::vector<Packed> packed(n);
  std::vector<StepRow> rows;
  if (n > 0) {
    EXPECT_GE(H5Dread(dataset, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, packed.data()), 0);
    for (const auto& p : packed) rows.push_back({p.step, p.loss, p.phase ? p.phase : ""});
#if H5_VERSION_GE(1, 12, 0)
    H5Treclaim(mem, space, H5P_DEFAULT, packed.data());
#else
    H5Dvlen_reclaim(mem, space, H5P_DEFAULT, packed.data());
#endif
  }
  H5Tclose(mem);
  H5Tclose(str);
  H5Sclose(space);
  H5Dclose(dataset);
  return rows;
}

const std::vector<Column> kStepColumns{{"step", T::i64, ""}, {"loss", T::f64, "nats"}, {"phase", T::str, ""}};
// Longer than the 64 bytes of schema 1's fixed-length strings, with a multi-byte character at
// byte 64.
const std::string kLong = std::string(63, 'x') + "\xc3\xa9 = 2 * (n - 1) / n * bytes, formula of 100 bytes and more .....";

TEST(Results, WriteFinishAndReadBack) {
  TempDir dir;
  const std::string path = dir.file("nested/dir/run.h5");   // parents are created
  lmscale::Config cfg = lmscale::io::parse_deck_text("[model]\nd_model = 256\nnum_heads = 8\n", {}, 1);
  cfg.command_line = "lmscale deck.ini --x=1";
  cfg.deck_text = "[model]\nd_model = 256\n";
  {
    ResultsFile f(path, true);
    EXPECT_TRUE(f.active());
    f.write_provenance(cfg, 4);
    Table steps = f.create_table("/train/steps", kStepColumns);
    EXPECT_TRUE(steps.active());
    steps.append({std::int64_t{1}, 2.5, std::string("train")});
    steps.append({std::int64_t{2}, std::int64_t{2}, kLong});   // int64 into f64; a long string, whole
    std::vector<Row> many;
    for (std::int64_t i = 0; i < 300; ++i) many.push_back({i + 3, 1.0 / static_cast<double>(i + 1), std::string("eval")});
    steps.append_rows(many);   // crosses the 256-row chunk boundary
    EXPECT_EQ(steps.rows(), 302);
    Table results = f.create_table("/bench_collectives/results", {{"bytes", T::i64, "B"}, {"busbw", T::f64, "GB/s"}});
    results.append({std::int64_t{1024}, 3.25});
    f.set_attr("/bench_model/summary", "mean_ms", 1.5);
    f.set_attr("/bench_model/summary", "mean_ms", 2.5);   // replaced
    f.set_attr("/train/steps", "note", std::string("loss is the global mean"));
    f.set_attr("/", "stage_bytes", std::vector<std::int64_t>{1, 2, 3});
    f.set_attr("/bench_model/summary", "tokens_per_s", 1000.0);
    f.set_attr("/bench_model/summary", "mode", std::string("train-step"));   // a string: no unit
    const std::vector<double> timeline{0, 1, 2, 3, 4, 5};
    f.write_array("/memory/timeline_bytes", {2, 3}, timeline.data());
    const std::vector<float> one{7.5f};
    f.write_array("/memory/scalar", {}, one.data());
    EXPECT_TRUE(fs::exists(path + ".tmp"));
    EXPECT_FALSE(fs::exists(path));
    f.finish();
    EXPECT_THROW(f.set_attr("/", "late", 1.0), lmscale::Error);
    EXPECT_THROW(steps.append({std::int64_t{9}, 1.0, std::string("late")}), lmscale::Error);
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  ASSERT_TRUE(fs::exists(path));

  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  EXPECT_EQ(read_string_attr(file, "schema"), "lmscale-results/2");
  EXPECT_EQ(read_string_attr(file, "version"), lmscale::kVersion);
  EXPECT_EQ(read_string_attr(file, "git_commit"), lmscale::kGitCommit);
  EXPECT_EQ(read_string_attr(file, "command_line"), cfg.command_line);
  EXPECT_EQ(read_string_attr(file, "deck"), cfg.deck_text);
  EXPECT_EQ(read_string_attr(file, "config"), cfg.resolved);
  EXPECT_EQ(read_int_attr(file, "world_size"), 4);
  const std::string utc = read_string_attr(file, "utc_time");
  EXPECT_EQ(utc.size(), 20u) << utc;   // 2025-01-31T12:34:56Z
  EXPECT_EQ(utc.back(), 'Z');

  const auto rows = read_steps(file, "/train/steps");
  ASSERT_EQ(rows.size(), 302u);
  EXPECT_EQ(rows[0].step, 1);
  EXPECT_EQ(rows[0].loss, 2.5);
  EXPECT_EQ(rows[0].phase, "train");
  EXPECT_EQ(rows[1].loss, 2.0);
  EXPECT_EQ(rows[1].phase, kLong);
  for (std::size_t i = 2; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].step, static_cast<std::int64_t>(i) + 1);
    EXPECT_EQ(rows[i].loss, 1.0 / static_cast<double>(i - 1));
    EXPECT_EQ(rows[i].phase, "eval");
  }

  const hid_t steps = H5Dopen2(file, "/train/steps", H5P_DEFAULT);
  EXPECT_EQ(read_units(steps), (std::vector<std::string>{"", "nats", ""}));
  EXPECT_EQ(read_string_attr(steps, "note"), "loss is the global mean");
  // Layout: 1-D, chunked by 256 rows, unlimited.
  const hid_t space = H5Dget_space(steps);
  hsize_t dims = 0, maxdims = 0;
  EXPECT_EQ(H5Sget_simple_extent_dims(space, &dims, &maxdims), 1);
  EXPECT_EQ(maxdims, H5S_UNLIMITED);
  const hid_t dcpl = H5Dget_create_plist(steps);
  hsize_t chunk = 0;
  EXPECT_EQ(H5Pget_chunk(dcpl, 1, &chunk), 1);
  EXPECT_EQ(chunk, 256u);
  // Field order and file types.
  const hid_t type = H5Dget_type(steps);
  ASSERT_EQ(H5Tget_nmembers(type), 3);
  const char* names[] = {"step", "loss", "phase"};
  for (unsigned i = 0; i < 3; ++i) {
    char* name = H5Tget_member_name(type, i);
    EXPECT_STREQ(name, names[i]);
    H5free_memory(name);
  }
  H5Tclose(type);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Dclose(steps);

  const hid_t results = H5Dopen2(file, "/bench_collectives/results", H5P_DEFAULT);
  EXPECT_EQ(read_units(results), (std::vector<std::string>{"B", "GB/s"}));
  H5Dclose(results);

  const hid_t summary = H5Gopen2(file, "/bench_model/summary", H5P_DEFAULT);
  ASSERT_GE(summary, 0);
  const hid_t mean = H5Aopen(summary, "mean_ms", H5P_DEFAULT);
  double mean_ms = 0;
  H5Aread(mean, H5T_NATIVE_DOUBLE, &mean_ms);
  EXPECT_EQ(mean_ms, 2.5);
  H5Aclose(mean);
  // Units of the numeric attributes, a JSON object; strings have none.
  EXPECT_EQ(read_string_attr(summary, "attribute_units"), R"({"mean_ms": "ms", "tokens_per_s": "tokens/s"})");
  H5Gclose(summary);
  EXPECT_EQ(read_string_attr(file, "attribute_units"), R"({"stage_bytes": "bytes", "world_size": ""})");

  const hid_t sizes = H5Aopen(file, "stage_bytes", H5P_DEFAULT);
  std::int64_t sizes_values[3] = {};
  H5Aread(sizes, H5T_NATIVE_INT64, sizes_values);
  EXPECT_EQ(sizes_values[2], 3);
  H5Aclose(sizes);

  const hid_t timeline = H5Dopen2(file, "/memory/timeline_bytes", H5P_DEFAULT);
  const hid_t tspace = H5Dget_space(timeline);
  hsize_t tdims[2] = {};
  EXPECT_EQ(H5Sget_simple_extent_dims(tspace, tdims, nullptr), 2);
  EXPECT_EQ(tdims[0], 2u);
  EXPECT_EQ(tdims[1], 3u);
  double values[6] = {};
  H5Dread(timeline, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
  EXPECT_EQ(values[5], 5.0);
  H5Sclose(tspace);
  H5Dclose(timeline);
  H5Fclose(file);
}

// A crash after flush(): the process dies without destructors; NAME.tmp holds the flushed rows.
TEST(Results, CrashLeavesFlushedRowsInTmp) {
  TempDir dir;
  const std::string path = dir.file("crash.h5");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ResultsFile f(path, true);
    lmscale::Config cfg;
    cfg.resolved = "[run]\n";
    f.write_provenance(cfg, 1);
    Table t = f.create_table("/train/steps", kStepColumns);
    t.append({std::int64_t{1}, 3.0, std::string("a")});
    t.append({std::int64_t{2}, 2.0, std::string("b")});
    t.flush();
    ::_exit(0);   // no destructors, no atexit handlers: like a crash
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_FALSE(fs::exists(path));
  ASSERT_TRUE(fs::exists(path + ".tmp"));
  const hid_t file = H5Fopen((path + ".tmp").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  EXPECT_EQ(read_string_attr(file, "schema"), "lmscale-results/2");
  const auto rows = read_steps(file, "/train/steps");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].step, 2);
  EXPECT_EQ(rows[1].loss, 2.0);
  EXPECT_EQ(rows[1].phase, "b");
  H5Fclose(file);
}

TEST(Results, UnfinishedFileStaysTmp) {
  TempDir dir;
  const std::string path = dir.file("unfinished.h5");
  {
    ResultsFile f(path, true);
    Table t = f.create_table("/train/steps", kStepColumns);
    t.append({std::int64_t{5}, 1.0, std::string("x")});
  }   // destroyed without finish(), e.g. by an exception
  EXPECT_FALSE(fs::exists(path));
  ASSERT_TRUE(fs::exists(path + ".tmp"));
  const hid_t file = H5Fopen((path + ".tmp").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  EXPECT_EQ(read_steps(file, "/train/steps").size(), 1u);
  H5Fclose(file);
}

// A run that fails before its first result row leaves nothing: neither NAME.tmp nor the
// directories made for it. Provenance and /system rows are not results.
TEST(Results, AbandonedBeforeResultsLeavesNothing) {
  TempDir dir;
  const std::string path = dir.file("made/for/it/out.h5");
  {
    ResultsFile f(path, true);
    lmscale::Config cfg;
    f.write_provenance(cfg, 1);
    Table ranks = f.create_table("/system/ranks", lmscale::io::system_ranks_columns());
    ranks.append({std::int64_t{0}, std::string("h"), std::int64_t{0}, std::string("cpu"), std::string("cpu"),
                  std::string(""), std::string(""), std::string(""), std::string(""), std::string("")});
    Table steps = f.create_table("/train/steps", kStepColumns);   // created, no row yet
    ASSERT_TRUE(fs::exists(path + ".tmp"));
    EXPECT_FALSE(f.has_results());
    EXPECT_EQ(f.abandon(), "");
    EXPECT_EQ(f.abandon(), "");   // once
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(dir.file("made")));   // the directories it created are gone too
}

// After the first row, abandon() keeps NAME.tmp and names it (main's error message uses it).
TEST(Results, AbandonedAfterResultsKeepsAndNamesTmp) {
  TempDir dir;
  const std::string path = dir.file("out.h5");
  ResultsFile f(path, true);
  Table t = f.create_table("/bench/rows", kStepColumns);
  t.append({std::int64_t{1}, 1.0, std::string("x")});
  EXPECT_TRUE(f.has_results());
  EXPECT_EQ(f.result_rows(), 1);
  EXPECT_EQ(f.abandon(), path + ".tmp");
  EXPECT_FALSE(fs::exists(path));
  const hid_t file = H5Fopen((path + ".tmp").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  EXPECT_EQ(read_steps(file, "/bench/rows").size(), 1u);
  H5Fclose(file);
}

// The final rename replaces only a regular file (HDF5 or empty) or a new name: a FIFO that
// appeared at NAME during the run is left alone and the complete file stays as NAME.tmp.
TEST(Results, FinishNeverReplacesAFifo) {
  TempDir dir;
  const std::string path = dir.file("out.h5");
  ResultsFile f(path, true);
  Table t = f.create_table("/train/steps", kStepColumns);
  t.append({std::int64_t{1}, 1.0, std::string("x")});
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  try {
    f.finish();
    FAIL() << "finish() replaced a FIFO";
  } catch (const lmscale::Error& e) {
    EXPECT_NE(std::string(e.what()).find("FIFO"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path + ".tmp"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_fifo(path));
  EXPECT_TRUE(fs::is_regular_file(path + ".tmp"));
}

// A regular file that is not HDF5 (someone's notes) is not replaced either; an HDF5 file is.
TEST(Results, FinishReplacesHdf5ButNotOtherFiles) {
  TempDir dir;
  const std::string notes = dir.file("notes.h5");
  {
    ResultsFile f(notes, true);
    FILE* other = std::fopen(notes.c_str(), "w");
    ASSERT_NE(other, nullptr);
    std::fputs("my notes\n", other);
    std::fclose(other);
    EXPECT_THROW(f.finish(), lmscale::Error);
  }
  EXPECT_EQ(fs::file_size(notes), 9u);
  const std::string previous = dir.file("previous.h5");
  for (int run = 0; run < 2; ++run) {   // the second run replaces the first one's file
    ResultsFile f(previous, true);
    f.set_attr("/", "steps", std::int64_t{run});
    f.finish();
  }
  const hid_t file = H5Fopen(previous.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  std::int64_t run = -1;
  const hid_t attr = H5Aopen(file, "steps", H5P_DEFAULT);
  H5Aread(attr, H5T_NATIVE_INT64, &run);
  H5Aclose(attr);
  H5Fclose(file);
  EXPECT_EQ(run, 1);
}

TEST(Results, InactiveFileDoesNothing) {
  TempDir dir;
  const std::string path = dir.file("rank1.h5");
  ResultsFile f(path, false);
  EXPECT_FALSE(f.active());
  f.write_provenance(lmscale::Config{}, 2);
  Table t = f.create_table("/train/steps", kStepColumns);
  EXPECT_FALSE(t.active());
  t.append({std::int64_t{1}, 1.0, std::string("x")});
  EXPECT_EQ(t.rows(), 0);
  f.set_attr("/", "a", 1.0);
  f.flush();
  f.finish();
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(Results, BadRowsAndTablesThrow) {
  TempDir dir;
  ResultsFile f(dir.file("bad.h5"), true);
  Table t = f.create_table("/train/steps", kStepColumns);
  try {
    t.append({std::int64_t{1}, std::string("oops"), std::string("x")});
    FAIL() << "no error";
  } catch (const lmscale::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'loss'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.append({1.5, 1.0, std::string("x")}), lmscale::Error);   // double into int64
  EXPECT_THROW(t.append({std::int64_t{1}, 1.0}), lmscale::Error);        // too few cells
  EXPECT_EQ(t.rows(), 0);
  EXPECT_THROW(f.create_table("/train/steps", kStepColumns), lmscale::Error);   // exists
  EXPECT_THROW(f.create_table("/x", {{"a", T::i64, ""}, {"a", T::f64, ""}}), lmscale::Error);
  EXPECT_THROW(f.create_table("/y", {}), lmscale::Error);
  EXPECT_THROW(t.append({std::int64_t{1}, 1.0, std::string("a\0b", 3)}), lmscale::Error);   // NUL in a string
}

TEST(Results, NumericAttributesNeedAUnit) {
  TempDir dir;
  ResultsFile f(dir.file("units.h5"), true);
  try {
    f.set_attr("/train", "frobnication", 1.0);
    FAIL() << "no error";
  } catch (const lmscale::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'frobnication'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("result_units.cpp"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(f.set_attr("/train", "note", std::string("strings have no unit")));
  EXPECT_THROW(f.set_attr("/train", "attribute_units", std::string("{}")), lmscale::Error);   // reserved
  EXPECT_THROW(f.set_attr("/train", "units", std::string("")), lmscale::Error);
  f.finish();
  // Refused before anything was written: no attribute without its unit.
  const hid_t file = H5Fopen(dir.file("units.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t train = H5Gopen2(file, "/train", H5P_DEFAULT);
  EXPECT_EQ(H5Aexists(train, "frobnication"), 0);
  EXPECT_EQ(H5Aexists(train, "attribute_units"), 0);   // only a string attribute
  H5Gclose(train);
  H5Fclose(file);
}

TEST(Results, UnitsOfAttributeNames) {
  using lmscale::io::attribute_unit;
  EXPECT_EQ(attribute_unit("achieved_flops"), "FLOP/s");   // a rate, not a count
  EXPECT_EQ(attribute_unit("flops_per_step"), "FLOP");
  EXPECT_EQ(attribute_unit("tokens_per_s"), "tokens/s");
  EXPECT_EQ(attribute_unit("mfu"), "");
  EXPECT_EQ(attribute_unit("final_loss"), "nats");
  EXPECT_EQ(attribute_unit("total_ms_median"), "ms");
  EXPECT_EQ(attribute_unit("fsdp_forward_wait_ms"), "ms");
  EXPECT_EQ(attribute_unit("predicted_peak_bytes_cuda"), "bytes");
  EXPECT_EQ(attribute_unit("data_train_bytes"), "bytes");
  EXPECT_EQ(attribute_unit("analysis_link_bytes_per_s"), "bytes/s");
  EXPECT_EQ(attribute_unit("max_busbw_gbs"), "GB/s");
  EXPECT_EQ(attribute_unit("price_per_gpu_hour"), "currency/h");
  EXPECT_FALSE(attribute_unit("made_up_name").has_value());
  EXPECT_FALSE(attribute_unit("ms").has_value());
}

TEST(Results, CpuModelFromCpuinfo) {
  std::istringstream x86("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+  \n"
                         "processor\t: 1\nmodel name\t: other\n");
  EXPECT_EQ(lmscale::cpu_model_from_cpuinfo(x86), "Intel(R) Xeon(R) Platinum 8480+");
  std::istringstream arm("processor : 0\nBogoMIPS : 50.00\nCPU implementer : 0x41\n");
  EXPECT_EQ(lmscale::cpu_model_from_cpuinfo(arm), "");
  std::istringstream arm_named("Model name : Neoverse-V2\n");
  EXPECT_EQ(lmscale::cpu_model_from_cpuinfo(arm_named), "Neoverse-V2");
  EXPECT_FALSE(lmscale::cpu_model_name().empty());
}

TEST(Results, SystemRanksColumns) {
  std::vector<std::string> names;
  for (const auto& c : lmscale::io::system_ranks_columns()) names.push_back(c.name);
  EXPECT_EQ(names, (std::vector<std::string>{"rank", "host", "local_rank", "device", "device_name", "mpi", "hdf5",
                                             "nccl", "cuda", "blas"}));
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  EXPECT_EQ(lmscale::io::hdf5_version(), std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release));
}

}  // namespace
