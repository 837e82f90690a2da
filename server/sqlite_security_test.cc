// Schema v4 -> v5: join tokens become their SHA-256, each job gains a submitter (empty for jobs
// from before), and the raw token is gone from the file. Also the token-file parser.
#include <sqlite3.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "server/security.h"
#include "server/sqlite_store.h"
#include "tests/support/temp_dir.h"

namespace latchkey {
namespace {

using testing::ScopedTempDir;

std::string RawSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return "cannot open";
  char* err = nullptr;
  std::string out;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) out = err ? err : "error";
  sqlite3_free(err);
  sqlite3_close(db);
  return out;
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(SqliteSecurityTest, MigratesAVersion4FileHashingJoinTokensAndAddingTheSubmitter) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/coord.db";
  const std::string raw = "v4-raw-join-token-0123456789abcd";
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    JobRecord j;
    j.job_id = "job-000001";
    j.seq = 1;
    j.join_token = raw;  // as a v4 coordinator stored it
    ASSERT_TRUE((*store)->CreateJob(j).ok());
  }
  // Back to the v4 layout: no submitter, first_sample or job_uid columns, no attempts table,
  // no memory columns in step_reports, the version 4 (v7 rebuilds the latches table by column
  // name, whatever else it holds).
  ASSERT_EQ(RawSql(path,
                   "ALTER TABLE jobs DROP COLUMN job_uid; "
                   "ALTER TABLE jobs DROP COLUMN submitter; ALTER TABLE jobs DROP COLUMN "
                   "next_first_sample; ALTER TABLE latches DROP COLUMN first_sample; "
                   "DROP TABLE attempts; ALTER TABLE step_reports DROP COLUMN peak_memory_bytes; "
                   "ALTER TABLE step_reports DROP COLUMN activation_memory_bytes; "
                   "ALTER TABLE step_reports DROP COLUMN reserved_memory_bytes; "
                   "PRAGMA user_version = 4"),
            "");
  ASSERT_NE(FileBytes(path).find(raw), std::string::npos);
  {
    auto store = SqliteStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    auto jobs = (*store)->LoadJobs();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ASSERT_EQ(jobs->size(), 1u);
    EXPECT_EQ(jobs->front().join_token, Sha256Hex(raw));
    EXPECT_EQ(jobs->front().submitter, "");
    JobRecord k;
    k.job_id = "job-000002";
    k.seq = 2;
    k.join_token = Sha256Hex("other");
    k.submitter = "alice";
    ASSERT_TRUE((*store)->CreateJob(k).ok());
  }
  ASSERT_EQ(RawSql(path, "VACUUM"), "");
  EXPECT_EQ(FileBytes(path).find(raw), std::string::npos);
  EXPECT_EQ(FileBytes(path + "-wal").find(raw), std::string::npos);
  auto again = SqliteStore::Open(path);
  ASSERT_TRUE(again.ok()) << again.status();
  auto jobs = (*again)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ(jobs->back().submitter, "alice");
  EXPECT_EQ(jobs->front().join_token, Sha256Hex(raw));  // hashed once, not again
}

TEST(SqliteSecurityTest, TokenFileParsesRolesCaseInsensitiveHexAndNamesABadLine) {
  const std::string h = Sha256Hex("tok-admin");
  std::string upper = Sha256Hex("tok-read");
  for (char& c : upper) c = static_cast<char>(toupper(c));
  auto t = TokenTable::Parse("# comment\n\nadmin root " + h + "\nread viewer " + upper +
                                 "\nsubmit alice " + Sha256Hex("tok-submit") + "\n",
                             "F");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 3u);
  ASSERT_TRUE(t->Find("tok-admin"));
  EXPECT_EQ(t->Find("tok-admin")->role, Role::kAdmin);
  ASSERT_TRUE(t->Find("tok-read"));
  EXPECT_EQ(t->Find("tok-read")->name, "viewer");
  EXPECT_EQ(t->Find("tok-submit")->role, Role::kSubmit);
  EXPECT_FALSE(t->Find("nope"));
  for (const std::string& bad : {std::string("boss x ") + h, std::string("read x abc"),
                                 std::string("read x"), "read x " + h + " extra"}) {
    auto r = TokenTable::Parse("# ok\nadmin root " + h + "\n" + bad + "\n", "F");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("F: line 3"), std::string::npos) << r.status();
  }
}

TEST(SqliteSecurityTest, LoopbackListenAndBearerParsing) {
  EXPECT_TRUE(IsLoopbackListen("127.0.0.1:0"));
  EXPECT_TRUE(IsLoopbackListen("localhost:50051"));
  EXPECT_TRUE(IsLoopbackListen("[::1]:1"));
  EXPECT_FALSE(IsLoopbackListen("0.0.0.0:0"));
  EXPECT_FALSE(IsLoopbackListen("[::]:1"));
  EXPECT_FALSE(IsLoopbackListen("10.0.0.5:1"));
  EXPECT_EQ(BearerToken("Bearer abc").value_or(""), "abc");
  EXPECT_FALSE(BearerToken("Basic abc"));
  EXPECT_FALSE(BearerToken("Bearer "));
}

}  // namespace
}  // namespace latchkey
