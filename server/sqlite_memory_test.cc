// The coordinator's side of the ranks' memory (docs/memory.md "Measuring memory"). Schema v8:
// the step reports' memory columns; a v7 file migrates with its reports reading 0 bytes, a report
// stored after keeps its three values. The step summary: the largest peak over the ranks, and
// each rank's.
#include <sqlite3.h>

#include <string>

#include "gtest/gtest.h"
#include "server/sqlite_store.h"
#include "server/step_aggregator.h"
#include "tests/support/temp_dir.h"

namespace latchkey {
namespace {

std::string Exec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return "cannot open";
  char* err = nullptr;
  std::string out;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    out = err ? err : "error";
  }
  sqlite3_free(err);
  sqlite3_close(db);
  return out;
}

int64_t Int(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return -1;
  sqlite3_stmt* st = nullptr;
  int64_t v = -1;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW) {
    v = sqlite3_column_int64(st, 0);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

StepReportRecord Report(int rank, int64_t step) {
  StepReportRecord r;
  r.job_id = "job-000001";
  r.rank = rank;
  r.report.step = step;
  r.report.loss = 2.5;
  return r;
}

TEST(SqliteMemoryColumnsTest, MigratesAVersion7FileAndStoresTheMemoryOfNewReports) {
  testing::ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  {
    // A v7 file: today's schema without the three columns v8 adds (and v10's job_uid, v11's
    // latches.replica_micro_batches), holding one report.
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->InsertStepReport(Report(0, 0)).ok());
  }
  ASSERT_EQ(Exec(path,
                 "ALTER TABLE step_reports DROP COLUMN peak_memory_bytes;"
                 "ALTER TABLE step_reports DROP COLUMN activation_memory_bytes;"
                 "ALTER TABLE step_reports DROP COLUMN reserved_memory_bytes;"
                 "ALTER TABLE jobs DROP COLUMN job_uid;"
                 "ALTER TABLE latches DROP COLUMN replica_micro_batches;"
                 "PRAGMA user_version = 7;"),
            "");
  ASSERT_EQ(Int(path, "PRAGMA user_version"), 7);
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto before = (*store)->LoadStepReport("job-000001", 0, 0);
    ASSERT_TRUE(before.ok()) << before.status();
    EXPECT_EQ(before->report.loss, 2.5);  // the v7 row is untouched
    EXPECT_EQ(before->report.peak_memory_bytes, 0);
    EXPECT_EQ(before->report.activation_memory_bytes, 0);
    EXPECT_EQ(before->report.reserved_memory_bytes, 0);
    StepReportRecord fresh = Report(1, 0);
    fresh.report.peak_memory_bytes = int64_t{5} << 33;  // beyond 32 bits: 40 GiB
    fresh.report.activation_memory_bytes = 123456789;
    fresh.report.reserved_memory_bytes = int64_t{6} << 33;
    ASSERT_TRUE((*store)->InsertStepReport(fresh).ok());
  }
  EXPECT_EQ(Int(path, "PRAGMA user_version"), SqliteStore::kSchemaVersion);
  EXPECT_EQ(SqliteStore::kSchemaVersion, 11);
  auto again = SqliteStore::Open(path);
  ASSERT_TRUE(again.ok()) << again.status();
  auto fresh = (*again)->LoadStepReport("job-000001", 1, 0);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->report.peak_memory_bytes, int64_t{5} << 33);
  EXPECT_EQ(fresh->report.activation_memory_bytes, 123456789);
  EXPECT_EQ(fresh->report.reserved_memory_bytes, int64_t{6} << 33);
  EXPECT_EQ(Int(path, "SELECT MAX(peak_memory_bytes) FROM step_reports"), int64_t{5} << 33);
}

TEST(StepAggregatorMemoryTest, SummaryCarriesTheLargestPeakAndEachRanks) {
  StepAggregator agg(/*world_size=*/2, /*keep=*/4);
  StepReportRecord r0 = Report(0, 5), r1 = Report(1, 5);
  r0.report.peak_memory_bytes = 300;
  r1.report.peak_memory_bytes = 700;
  agg.Add(r1);
  EXPECT_FALSE(agg.Last().has_value());  // rank 0 has not reported step 5 yet
  agg.Add(r0);
  const std::optional<CompletedStep> step = agg.Last();
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->report.peak_memory_bytes, 700);
  EXPECT_EQ(step->rank_peak_memory_bytes, (std::map<int, int64_t>{{0, 300}, {1, 700}}));
}

// The status page's collective share: each rank's collective_seconds over its step_seconds;
// none for reports read back from the store (it keeps no collective_seconds).
TEST(StepAggregatorMemoryTest, SummaryCarriesEachRanksCollectiveShare) {
  StepAggregator agg(/*world_size=*/2, /*keep=*/4);
  StepReportRecord r0 = Report(0, 5), r1 = Report(1, 5);
  r0.report.step_seconds = 2.0;
  r0.report.collective_seconds = 0.5;
  r1.report.step_seconds = 4.0;
  r1.report.collective_seconds = 3.0;
  agg.Add(r0);
  agg.Add(r1);
  std::optional<CompletedStep> step = agg.Last();
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->rank_collective_share, (std::map<int, double>{{0, 0.25}, {1, 0.75}}));

  StepReportRecord s0 = Report(0, 6), s1 = Report(1, 6);
  s0.collective_seconds_stored = false;
  s1.report.step_seconds = 1.0;
  s1.report.collective_seconds = 0.5;
  agg.Add(s0);
  agg.Add(s1);
  step = agg.Last();
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->report.step, 6);
  EXPECT_EQ(step->rank_collective_share, (std::map<int, double>{{1, 0.5}}));
}

}  // namespace
}  // namespace latchkey
