// Checkpoint saves that fail because the disk is full (docs/fault-tolerance.md, "Disk full"),
// with real latchkey-worker processes: a 2-rank job (TP 2) checkpoints every 2 steps into a
// tmpfs sized, from the measured size of a save, so that the first save fits and no later one
// does. The job completes every step with the per-step losses of a run whose saves all
// committed; the saves after steps 3, 5 and 7 are dropped on every rank (no manifest, no
// temporary folder left), counted by latchkey_checkpoint_failures_total and named on each
// rank's stderr with the file and the errno text; the checkpoint after step 1 stays, verifies,
// holds the uninterrupted run's bytes and resumes to the same losses. Synchronous and
// asynchronous saves; and under `latchkey up`, where the job succeeds with 0 restarts.
//
// The tmpfs is mounted in a mount namespace of this test process's own (unshare(CLONE_NEWNS)),
// which the workers it starts inherit: nothing is mounted outside it, nothing outlives it. That
// needs root (CAP_SYS_ADMIN): without it the cases skip, naming the reason; with CI=true they
// fail instead.
#include <errno.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/mount.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/subprocess.h"
#include "tests/support/launch.h"
#include "tests/support/metrics_scrape.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tools.h"
#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kWorld = 2;
constexpr int kSteps = 8;
// Saves after steps 1, 3, 5, 7: only the first fits.
constexpr int kDropped = 3;

// This thread's own mount namespace, made once, with every mount private (what it mounts is
// seen by no one else; the workers started from it inherit it). "" when made, else why not.
const std::string& PrivateMounts() {
  static const std::string why = []() -> std::string {
    if (::unshare(CLONE_NEWNS) != 0) {
      return std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
    }
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      return std::string("mount --make-rprivate /: ") + std::strerror(errno);
    }
    return "";
  }();
  return why;
}

// Skips (CI=true: fails) the case when a tmpfs cannot be mounted here.
#define REQUIRE_MOUNTS()                                                                   \
  do {                                                                                     \
    const std::string& why = PrivateMounts();                                              \
    if (!why.empty()) {                                                                    \
      if (InCi()) FAIL() << "cannot mount a tmpfs (" << why << "); CI=true requires root"; \
      GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << why;                        \
    }                                                                                      \
  } while (0)

// A tmpfs of `bytes` mounted on `dir` (empty folder) for the object's life.
class Tmpfs {
 public:
  Tmpfs(const std::string& dir, int64_t bytes) : dir_(dir) {
    const std::string options = "size=" + std::to_string(bytes) + ",mode=0755";
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      error_ = "mount -t tmpfs -o " + options + " " + dir + ": " + std::strerror(errno);
    }
  }
  ~Tmpfs() {
    if (error_.empty()) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  Tmpfs(const Tmpfs&) = delete;
  Tmpfs& operator=(const Tmpfs&) = delete;
  const std::string& error() const { return error_; }

 private:
  std::string dir_;
  std::string error_;
};

// TP 2 on 2 ranks, AdamW, a checkpoint after every second step into `dir` (relative: to the
// spec's folder), every one kept; synchronous unless `async`.
nlohmann::json DiskFullSpec(const std::string& dir, bool async) {
  SpecParams p;
  p.steps = kSteps;
  p.seed = 7;
  p.extra_latchkey["checkpoint"] = {
      {"dir", dir}, {"every_steps", 2}, {"keep", 10}, {"async", async}};
  return SpecObject(p);
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string Joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : " ") + s;
  return out;
}

// The tmpfs bytes for checkpoints like the one in `step_dir`: every file in whole pages, and
// half as much again, so that one save fits and a second does not.
int64_t OneAndAHalfSaves(const std::string& step_dir) {
  int64_t pages = 0;
  for (const auto& e : fs::directory_iterator(step_dir)) {
    pages += (static_cast<int64_t>(fs::file_size(e.path())) + 4095) / 4096;
  }
  return (pages + (pages + 1) / 2) * 4096;
}

// The last record of every step of a rank.
std::map<int64_t, nlohmann::json> LastPerStep(const std::vector<nlohmann::json>& records) {
  std::map<int64_t, nlohmann::json> out;
  for (const auto& r : records) out[r["step"].get<int64_t>()] = r;
  return out;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Rank `rank`'s lines saying a save was dropped: one per save, each naming a rank file of the
// save's temporary folder and the errno text.
void ExpectDroppedLines(const std::string& text, int rank) {
  EXPECT_EQ(Count(text, ": not saved ("), kDropped) << text;
  for (int step : {3, 5, 7}) {
    EXPECT_NE(text.find("latchkey-worker: rank " + std::to_string(rank) +
                        ": checkpoint after step " + std::to_string(step) + ": not saved ("),
              std::string::npos)
        << text;
  }
  EXPECT_GE(Count(text, "No space left on device"), kDropped) << text;
  EXPECT_NE(text.find(".step-00000003."), std::string::npos) << text;
  EXPECT_NE(text.find("/rank-0000"), std::string::npos) << text;
}

// The folder after the run: the checkpoint after step 1 and nothing else (no temporary folder,
// no folder of a dropped save); it verifies and holds the same files as `want`'s.
void ExpectOnlyTheFirstSave(const std::string& root, const std::string& want) {
  EXPECT_EQ(Joined(Entries(root)), "step-00000001");
  for (int step : {3, 5, 7}) {
    EXPECT_FALSE(fs::exists(root + "/" + CheckpointStepDirName(step) + "/manifest.json"));
  }
  auto got = VerifyCheckpoint(root + "/step-00000001", "");
  ASSERT_TRUE(got.ok()) << got.status();
  auto expected = VerifyCheckpoint(want, "");
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(got->step, 1);
  ASSERT_EQ(got->files.size(), expected->files.size());
  for (size_t i = 0; i < got->files.size(); ++i) {
    EXPECT_EQ(got->files[i].sha256, expected->files[i].sha256) << got->files[i].name;
  }
}

// Every rank's last record of every step in `from`.. has the same loss and grad norm as
// `want`'s, exactly.
void ExpectSameLosses(const WorkerRun& got, const WorkerRun& want, int64_t from = 0) {
  for (int r = 0; r < kWorld; ++r) {
    const auto a = LastPerStep(got.steps[r]);
    const auto b = LastPerStep(want.steps[r]);
    ASSERT_EQ(a.size(), static_cast<size_t>(kSteps - from)) << "rank " << r;
    for (const auto& [step, rec] : a) {
      ASSERT_EQ(b.count(step), 1u) << step;
      EXPECT_EQ(rec["loss"].get<double>(), b.at(step)["loss"].get<double>())
          << "rank " << r << " step " << step;
      EXPECT_EQ(rec["grad_norm"].get<double>(), b.at(step)["grad_norm"].get<double>())
          << "rank " << r << " step " << step;
    }
  }
}

// The parameter: latchkey.checkpoint.async.
class DiskFull : public ::testing::TestWithParam<bool> {};

TEST_P(DiskFull, DroppedSavesLeaveNothingAndTrainingGoesOn) {
  REQUIRE_MOUNTS();
  const bool async = GetParam();
  // Every save fits: the losses to match, and the size of a save.
  const WorkerRun full = RunWorkers(DiskFullSpec("ckpt", async), kWorld);
  ASSERT_TRUE(full.ok()) << full.Describe();
  EXPECT_EQ(Joined(Entries(full.dir + "/ckpt")),
            "step-00000001 step-00000003 step-00000005 step-00000007");
  const int64_t bytes = OneAndAHalfSaves(full.dir + "/ckpt/step-00000007");

  const ScopedTempDir disk("disk-full");
  const Tmpfs tmpfs(disk.path(), bytes);
  ASSERT_EQ(tmpfs.error(), "");
  WorkerGroup group = StartWorkers(DiskFullSpec(disk.path(), async), kWorld,
                                   {"--metrics-port", "0", "--linger-seconds", "20"});
  std::vector<double> failures(kWorld, -1);
  for (int r = 0; r < kWorld; ++r) {
    const int port = WaitForRankMetricsPort(group, r);
    ASSERT_GT(port, 0) << RankStderr(group, r);
    const std::string text = ScrapeRankMetrics(port, "latchkey_optimizer_steps_total", kSteps);
    failures[r] = MetricSample(text, "latchkey_checkpoint_failures_total");
  }
  const WorkerRun run = WaitWorkers(std::move(group));
  ASSERT_TRUE(run.ok()) << "tmpfs of " << bytes << " bytes" << run.Describe();
  ExpectSameLosses(run, full);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(failures[r], kDropped) << "rank " << r;
    ExpectDroppedLines(run.stderr_text[r], r);
    EXPECT_EQ(run.stderr_text[r].find("restart"), std::string::npos) << run.stderr_text[r];
  }
  ExpectOnlyTheFirstSave(disk.path(), full.dir + "/ckpt/step-00000001");

  // The checkpoint left loads: resumed from it, the run ends as the uninterrupted one (its own
  // saves are dropped again, the disk being as full as before).
  const WorkerRun resumed = RunWorkers(DiskFullSpec(disk.path(), async), kWorld,
                                       {"--resume-from", disk.path() + "/step-00000001"});
  ASSERT_TRUE(resumed.ok()) << resumed.Describe();
  ExpectSameLosses(resumed, full, /*from=*/2);
  EXPECT_EQ(Joined(Entries(disk.path())), "step-00000001");
}

INSTANTIATE_TEST_SUITE_P(checkpoint, DiskFull, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "async" : "sync";
                         });

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

// The job id `up` printed ("job          <id>"); "" when none.
std::string UpJobId(const std::string& log) {
  const std::string tag = "job          ";
  const size_t at = log.find(tag);
  if (at == std::string::npos) return "";
  const size_t begin = at + tag.size();
  return log.substr(begin, log.find_first_of(" \n", begin) - begin);
}

// Under the coordinator: `latchkey up` of the same job, its saves dropped alike, succeeds with
// every step, the uninterrupted run's losses and no restart; the coordinator's last checkpoint
// stays the one after step 1.
class DiskFullUp : public ::testing::TestWithParam<bool> {};

TEST_P(DiskFullUp, TheJobSucceedsWithoutARestart) {
  REQUIRE_MOUNTS();
  const bool async = GetParam();
  const WorkerRun full = RunWorkers(DiskFullSpec("ckpt", async), kWorld);
  ASSERT_TRUE(full.ok()) << full.Describe();
  // The coordinator's manifests name a longer job id and a uid: a page more for them.
  const int64_t bytes = OneAndAHalfSaves(full.dir + "/ckpt/step-00000007") + 4096;

  const ScopedTempDir dir("disk-full-up");
  const std::string root = dir / "ckpt";
  fs::create_directories(root);
  const Tmpfs tmpfs(root, bytes);
  ASSERT_EQ(tmpfs.error(), "");
  nlohmann::json spec = DiskFullSpec(root, async);
  spec["latchkey"]["max_restarts"] = 3;
  std::ofstream(dir / "spec.json") << spec.dump(2);
  SpawnOptions o;
  o.args = {LATCHKEY_CLI_BIN, "up", "--spec", dir / "spec.json", "--run-dir", dir / "run"};
  o.extra_env = {"XDG_CONFIG_HOME=" + dir / "config", "XDG_STATE_HOME=" + dir / "state"};
  o.log_path = dir / "up.log";
  o.own_process_group = true;
  auto pid = Spawn(o);
  ASSERT_TRUE(pid.ok()) << pid.status();
  const int code = WaitProcess(*pid, std::chrono::seconds(240));
  if (code == -1) kill(-*pid, SIGKILL);  // never leave its children behind
  const std::string log = ReadText(o.log_path);
  ASSERT_EQ(code, 0) << log;
  EXPECT_EQ(log.find("(restart "), std::string::npos) << log;
  EXPECT_EQ(log.find("recovery     attempt"), std::string::npos) << log;
  EXPECT_NE(log.find("restarts                             0 (attempt 1)\n"), std::string::npos)
      << log;
  const std::string job = UpJobId(log);
  ASSERT_FALSE(job.empty()) << log;
  const auto rows =
      Query(dir / "run/coordinator.db",
            "SELECT restarts, attempt, last_checkpoint_step FROM jobs WHERE job_id = ?", job);
  ASSERT_EQ(rows.size(), 1u) << log;
  EXPECT_EQ(rows[0], (std::vector<std::string>{"0", "1", "1"})) << log;
  for (const auto& e : Query(dir / "run/coordinator.db",
                             "SELECT kind FROM job_events WHERE job_id = ? ORDER BY id", job)) {
    EXPECT_NE(e[0], "recovery") << log;
  }
  WorkerRun run;
  for (int r = 0; r < kWorld; ++r) {
    run.steps.push_back(StepRecords(dir / ("run/steps-" + std::to_string(r) + ".jsonl")));
  }
  ExpectSameLosses(run, full);
  std::string workers;
  for (const auto& e : fs::directory_iterator(dir / "run")) {
    if (e.path().extension() == ".log") workers += ReadText(e.path().string());
  }
  EXPECT_EQ(Count(log + workers, ": not saved ("), kWorld * kDropped) << log << workers;
  EXPECT_EQ(Joined(Entries(root)), "step-00000001");
  auto verified = VerifyCheckpoint(root + "/step-00000001", "");
  ASSERT_TRUE(verified.ok()) << verified.status();
}

INSTANTIATE_TEST_SUITE_P(checkpoint, DiskFullUp, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "async" : "sync";
                         });

}  // namespace
}  // namespace latchkey::testing
