// `latchkey up` of a diverging job (SGD at lr 1e9, TP 2, 2 workers, a checkpoint after every
// step, 3 restarts allowed), with real processes. Before, step 1's NaN loss was refused by the
// coordinator ("not stored"), the job recovered from the start three times and failed, and `up`
// died with nlohmann's "type must be number, but is null". Now the job fails at the diverged step
// within a short time with restarts 0, the cause naming the quantity, the step and the rank;
// `up` exits 10 (the job failed) printing that cause and a summary naming the step; no worker is
// started again; the database holds the step's report, a "diverged" event and the last good
// checkpoint, which verifies; nothing was saved for the diverged step.
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// One row's columns as text (NULL as "NULL"), for `sql` with one text parameter.
std::vector<std::vector<std::string>> Query(const std::string& db, const std::string& sql,
                                            const std::string& param) {
  std::vector<std::vector<std::string>> rows;
  sqlite3* h = nullptr;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) == SQLITE_OK) {
      sqlite3_bind_text(st, 1, param.c_str(), -1, SQLITE_TRANSIENT);
      while (sqlite3_step(st) == SQLITE_ROW) {
        std::vector<std::string> row;
        for (int c = 0; c < sqlite3_column_count(st); ++c) {
          const unsigned char* t = sqlite3_column_text(st, c);
          row.push_back(t == nullptr ? "NULL" : reinterpret_cast<const char*>(t));
        }
        rows.push_back(row);
      }
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
  return rows;
}

TEST(DivergeUp, TheJobFailsAtTheDivergedStepWithoutARestart) {
  const ScopedTempDir dir("diverge-up");
  SpecParams p;  // synthetic data, TP 2, 2 workers
  p.optimizer = "SGD";
  p.lr = 1e9;
  p.zero_stage = 0;
  p.gas = 2;
  p.micro_batch = 1;
  p.seq_len = 16;
  p.steps = 8;
  p.extra_latchkey["max_restarts"] = 3;
  p.extra_latchkey["checkpoint"] = {{"dir", dir.path() + "/ckpt"}, {"every_steps", 1}};
  const std::string spec = dir.path() + "/spec.json";
  std::ofstream(spec) << SpecJson(p);

  SpawnOptions o;
  o.args = {LATCHKEY_CLI_BIN, "up", "--spec", spec, "--run-dir", dir.path() + "/run"};
  o.extra_env = {"XDG_CONFIG_HOME=" + dir.path() + "/config",
                 "XDG_STATE_HOME=" + dir.path() + "/state"};
  o.log_path = dir.path() + "/up.log";
  o.own_process_group = true;
  const auto start = Clock::now();
  auto pid = Spawn(o);
  ASSERT_TRUE(pid.ok()) << pid.status();
  const int code = WaitProcess(*pid, std::chrono::seconds(240));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (code == -1) kill(-*pid, SIGKILL);  // never leave its children behind
  const std::string log = ReadText(o.log_path);
  EXPECT_EQ(code, 10) << log;  // the watched job failed
  EXPECT_LT(seconds, 120) << log;
  EXPECT_EQ(log.find("terminate called"), std::string::npos) << log;
  EXPECT_EQ(log.find("(restart "), std::string::npos) << log;  // no worker started again
  EXPECT_EQ(log.find("recovery     attempt"), std::string::npos) << log;

  std::smatch job_m;
  ASSERT_TRUE(std::regex_search(log, job_m, std::regex("job          (\\S+)"))) << log;
  const std::string job = job_m[1];
  // The cause, as `up` prints it: the quantity, the step and the rank.
  const std::regex cause_re(
      "latchkey: " + job +
      " failed: rank ([01]) \\(worker [^)]+\\): (loss|grad_norm) is (NaN|Inf|-Inf) at step "
      "([0-9]+) \\(rank ([01])\\) \\(training diverged: not retried\\)\n");
  std::smatch cause;
  ASSERT_TRUE(std::regex_search(log, cause, cause_re)) << log;
  EXPECT_EQ(cause[1], cause[5]);
  const int64_t step = std::stoll(cause[4]);
  ASSERT_GE(step, 1) << log;
  EXPECT_NE(log.find("restarts                             0 (attempt 1)\n"), std::string::npos)
      << log;
  EXPECT_NE(log.find("diverged at                          step " + std::to_string(step) +
                     " (loss or grad_norm not finite; not applied)\n"),
            std::string::npos)
      << log;

  const std::string db = dir.path() + "/run/coordinator.db";
  const auto rows = Query(
      db, "SELECT state, restarts, attempt, last_checkpoint_step FROM jobs WHERE job_id = ?", job);
  ASSERT_EQ(rows.size(), 1u) << log;
  EXPECT_EQ(rows[0], (std::vector<std::string>{"4", "0", "1", std::to_string(step - 1)}));
  const auto events = Query(db, "SELECT kind FROM job_events WHERE job_id = ? ORDER BY id", job);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()[0], "diverged");
  for (const auto& e : events) EXPECT_NE(e[0], "recovery");
  // Rank 0 reported the diverged step before its failure: the report is stored.
  const auto report =
      Query(db,
            "SELECT loss, grad_norm FROM step_reports WHERE job_id = ? AND rank = 0 "
            "AND step = " +
                std::to_string(step),
            job);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_TRUE(report[0][0] == "NaN" || report[0][0] == "Inf" || report[0][1] == "NaN" ||
              report[0][1] == "Inf")
      << report[0][0] << " " << report[0][1];

  // Rank 0's JSONL ends with the diverged step, its loss or grad_norm null.
  std::ifstream jsonl(dir.path() + "/run/steps-0.jsonl");
  nlohmann::json last;
  for (std::string line; std::getline(jsonl, line);) {
    if (!line.empty()) last = nlohmann::json::parse(line);
  }
  EXPECT_EQ(last["step"], step);
  EXPECT_TRUE(last["loss"].is_null() || last["grad_norm"].is_null()) << last.dump();

  // The last good checkpoint stays, and verifies; nothing of the diverged step.
  const std::string root = dir.path() + "/ckpt";
  EXPECT_FALSE(fs::exists(root + "/" + CheckpointStepDirName(step)));
  auto verified = VerifyCheckpoint(root + "/" + CheckpointStepDirName(step - 1), "");
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->step, step - 1);
}

}  // namespace
}  // namespace latchkey::testing
