// latchkey-coordinator started on a damaged database (docs/fault-tolerance.md "A damaged
// database"): garbage bytes, a real database cut in half, a damaged page, a write-ahead log whose
// header is garbage are each refused at start (exit 1, a message naming the file and what to do,
// the files byte for byte as they were); a log whose tail is torn (cut, or a byte changed) is
// SQLite's recovery: the coordinator starts with every job committed before the tear.
#include <sqlite3.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "client/job_client.h"
#include "gtest/gtest.h"
#include "tests/coordinator/harness.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

int64_t FileSize(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

std::string SubmitJob(JobClient& client, int i) {
  SpecParams p;
  p.world_size = 2;
  p.tp = 1;
  p.steps = 5 + i;
  JobSubmission req;
  req.spec_json = SpecJson(p);
  auto r = client.SubmitJob(req);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->job_id : "";
}

// A real store left as kill -9 leaves it: `early` jobs committed, the log's size then, and one
// `late` job committed after it, every commit still in the -wal.
struct CrashedStore {
  std::string db;
  std::vector<std::string> early;
  int64_t wal_before_late = 0;
  std::string late;
};

CrashedStore Crash(const std::string& dir) {
  CrashedStore s;
  s.db = dir + "/coord.db";
  CoordinatorProcess proc(s.db);
  if (!proc.Start()) {
    ADD_FAILURE() << "the coordinator did not start on " << s.db;
    return s;
  }
  JobClient client({proc.address(), absl::Seconds(5), absl::ZeroDuration(), {}});
  for (int i = 0; i < 3; ++i) s.early.push_back(SubmitJob(client, i));
  s.wal_before_late = FileSize(s.db + "-wal");
  s.late = SubmitJob(client, 3);
  proc.Kill9();
  EXPECT_GT(FileSize(s.db + "-wal"), s.wal_before_late) << "the late job's commit is in the log";
  return s;
}

// Starts the real binary on `db` and expects it refused: exit 1 (not a signal, not a sanitizer
// report), the message naming the file and saying what to do, no port file (it never served).
std::string ExpectRefused(const std::string& dir, const std::string& db) {
  const std::string port_file = dir + "/ports.json";
  const Captured run = RunAndCapture({CoordinatorBinary(), "--listen", "127.0.0.1:0", "--db", db,
                                      "--metrics-port", "-1", "--port-file", port_file},
                                     std::chrono::seconds(60));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("latchkey-coordinator: --db " + db + ": "), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("restore"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("Sanitizer"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("runtime error"), std::string::npos) << run.output;
  EXPECT_FALSE(std::filesystem::exists(port_file));
  return run.output;
}

TEST(StoreFaultTest, GarbageBytesAreRefusedAndLeftAsTheyWere) {
  const ScopedTempDir dir("store-fault");
  const std::string db = dir / "state.db";
  std::mt19937 rng(7);
  std::string garbage(64 * 1024, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  WriteBytes(db, garbage);
  const std::string out = ExpectRefused(dir.path(), db);
  EXPECT_NE(out.find("not a latchkey database (file is not a database): restore it from a backup "
                     "or move it aside to start empty"),
            std::string::npos)
      << out;
  EXPECT_EQ(Bytes(db), garbage);
}

TEST(StoreFaultTest, ADatabaseCutInHalfIsRefusedAndLeftAsItWas) {
  const ScopedTempDir dir("store-fault");
  const CrashedStore s = Crash(dir.path());
  // A clean start and stop checkpoints the log into the file and removes it.
  CoordinatorProcess proc(s.db);
  ASSERT_TRUE(proc.Start());
  ASSERT_EQ(proc.Terminate(), 0);
  ASSERT_FALSE(std::filesystem::exists(s.db + "-wal"));
  const std::string whole = Bytes(s.db);
  ASSERT_GT(whole.size(), 8u * 4096);
  const std::string half = whole.substr(0, whole.size() / 2);
  WriteBytes(s.db, half);
  const std::string out = ExpectRefused(dir.path(), s.db);
  EXPECT_NE(out.find("damaged ("), std::string::npos) << out;
  EXPECT_EQ(Bytes(s.db), half);
}

// A page no start-up read touches (the job_events table's root): without quick_check the
// coordinator served and failed at its first event.
TEST(StoreFaultTest, ADamagedPageIsRefusedAndLeftAsItWas) {
  const ScopedTempDir dir("store-fault");
  const CrashedStore s = Crash(dir.path());
  CoordinatorProcess proc(s.db);
  ASSERT_TRUE(proc.Start());
  ASSERT_EQ(proc.Terminate(), 0);
  int64_t root = 0, page_size = 0;
  {
    sqlite3* conn = nullptr;
    ASSERT_EQ(sqlite3_open_v2(s.db.c_str(), &conn, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(conn,
                                 "SELECT rootpage, (SELECT page_size FROM pragma_page_size) FROM "
                                 "sqlite_master WHERE name = 'job_events'",
                                 -1, &st, nullptr),
              SQLITE_OK);
    ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
    root = sqlite3_column_int64(st, 0);
    page_size = sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    sqlite3_close(conn);
  }
  ASSERT_GT(root, 1);
  std::string bytes = Bytes(s.db);
  ASSERT_GE(static_cast<int64_t>(bytes.size()), root * page_size);
  bytes.replace(static_cast<size_t>((root - 1) * page_size), 8, 8, '\x07');  // its b-tree header
  WriteBytes(s.db, bytes);
  const std::string out = ExpectRefused(dir.path(), s.db);
  EXPECT_NE(out.find("damaged (quick_check: Page " + std::to_string(root)), std::string::npos)
      << out;
  EXPECT_EQ(Bytes(s.db), bytes);
}

// SQLite would read a log whose header fails its checks as empty: every job above was
// committed only to the log, so it would have started on an empty store.
TEST(StoreFaultTest, AWriteAheadLogWithAGarbageHeaderIsRefusedAndLeftAsItWas) {
  const ScopedTempDir dir("store-fault");
  const CrashedStore s = Crash(dir.path());
  const std::string wal = s.db + "-wal";
  const std::string db_bytes = Bytes(s.db);
  const std::string original = Bytes(wal);
  ASSERT_GT(original.size(), 32u);

  std::string garbage_header = original;
  for (int i = 0; i < 32; ++i) garbage_header[static_cast<size_t>(i)] = static_cast<char>(0x5a ^ i);
  WriteBytes(wal, garbage_header);
  std::string out = ExpectRefused(dir.path(), s.db);
  EXPECT_NE(out.find("its write-ahead log " + wal + " is damaged (bad magic number"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("move the -wal aside"), std::string::npos) << out;
  EXPECT_EQ(Bytes(wal), garbage_header);
  EXPECT_EQ(Bytes(s.db), db_bytes);

  std::string flipped_salt = original;
  flipped_salt[17] = static_cast<char>(flipped_salt[17] ^ 0x01);  // salt-1
  WriteBytes(wal, flipped_salt);
  out = ExpectRefused(dir.path(), s.db);
  EXPECT_NE(out.find("is damaged (bad header checksum)"), std::string::npos) << out;
  EXPECT_EQ(Bytes(wal), flipped_salt);
  EXPECT_EQ(Bytes(s.db), db_bytes);
}

// A torn tail: the coordinator starts with every job committed before the tear, the late one
// (whose frames follow it) is not there, and it takes new jobs.
void ExpectRecoveredToTheTear(const CrashedStore& s) {
  CoordinatorProcess proc(s.db);
  ASSERT_TRUE(proc.Start());
  JobClient client({proc.address(), absl::Seconds(5), absl::ZeroDuration(), {}});
  for (const std::string& id : s.early) {
    const auto job = client.GetJob(id);
    EXPECT_TRUE(job.ok()) << id << ": " << job.status();
  }
  EXPECT_TRUE(absl::IsNotFound(client.GetJob(s.late).status())) << s.late;
  EXPECT_FALSE(SubmitJob(client, 9).empty());
  EXPECT_EQ(proc.Terminate(), 0);
}

TEST(StoreFaultTest, AWriteAheadLogCutShortKeepsEveryCommitBeforeTheCut) {
  const ScopedTempDir dir("store-fault");
  const CrashedStore s = Crash(dir.path());
  ASSERT_EQ(s.early.size(), 3u);
  const std::string wal = s.db + "-wal";
  // Inside the first frame written after the early jobs' commits.
  std::filesystem::resize_file(wal, static_cast<uintmax_t>(s.wal_before_late + 1000));
  ExpectRecoveredToTheTear(s);
}

TEST(StoreFaultTest, AWriteAheadLogWithAByteChangedInItsTailKeepsEveryCommitBeforeIt) {
  const ScopedTempDir dir("store-fault");
  const CrashedStore s = Crash(dir.path());
  ASSERT_EQ(s.early.size(), 3u);
  const std::string wal = s.db + "-wal";
  std::string bytes = Bytes(wal);
  // In the page of the first frame after the early jobs' commits (a frame header is 24 bytes):
  // its checksum fails, and the chain ends before it.
  const size_t at = static_cast<size_t>(s.wal_before_late) + 24 + 100;
  ASSERT_LT(at, bytes.size());
  bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
  WriteBytes(wal, bytes);
  ExpectRecoveredToTheTear(s);
}

}  // namespace
}  // namespace latchkey::testing
