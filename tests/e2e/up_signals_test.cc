// `latchkey up` stopped by each signal a user (or a terminal) sends it, with real processes: the
// built-in job (40 steps on synthetic data, 2 workers) is signalled while pending or running, and
// within 10 s of the signal no process of the run is alive, no /dev/shm segment names one of its
// processes, and the database (RUN/coordinator.db, read-only) holds the job as cancelled, naming
// why. Also: the coordinator's --cancel-on-shutdown, and `up --workers N` other than the
// spec's world size refused at once.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/subprocess.h"
#include "tests/support/coordinator_process.h"
#include "tests/support/proc_scan.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kCleanupBudget = seconds(10);  // from the signal to nothing left

struct JobRow {
  int state = -1;  // JobState: 1 pending, 2 running, 3 succeeded, 4 failed, 5 cancelled
  std::string reason;
};

// The job's row in the run's database, opened read-only.
JobRow ReadJob(const std::string& db, const std::string& job) {
  JobRow row;
  sqlite3* h = nullptr;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(h, "SELECT state, failure_reason FROM jobs WHERE job_id = ?", -1, &st,
                           nullptr) == SQLITE_OK) {
      sqlite3_bind_text(st, 1, job.c_str(), -1, SQLITE_TRANSIENT);
      if (sqlite3_step(st) == SQLITE_ROW) {
        row.state = sqlite3_column_int(st, 0);
        const unsigned char* reason = sqlite3_column_text(st, 1);
        if (reason != nullptr) row.reason = reinterpret_cast<const char*>(reason);
      }
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(h);
  return row;
}

// One `latchkey up` of the built-in job in <dir>/run, leader of a process group of its own, as
// a shell starts a foreground job: a signal to the group is what a terminal's Ctrl-C (or its
// closing) sends.
class UpRun {
 public:
  explicit UpRun(const std::string& dir, std::vector<std::string> extra = {})
      : run_(dir + "/run"), log_(dir + "/up.log"), config_(dir + "/config") {
    SpawnOptions o;
    o.args = {LATCHKEY_CLI_BIN, "up", "--run-dir", run_};
    // The user's credentials file of this run alone (XDG_CONFIG_HOME/latchkey/credentials).
    o.extra_env = {"XDG_CONFIG_HOME=" + config_};
    o.args.insert(o.args.end(), extra.begin(), extra.end());
    o.log_path = log_;
    o.own_process_group = true;
    auto pid = Spawn(o);
    pid_ = pid.ok() ? *pid : -1;
  }
  ~UpRun() {
    if (pid_ > 0 && code_ == kRunning) {
      kill(-pid_, SIGKILL);
      WaitProcess(pid_, seconds(10));
    }
    for (int p : LiveProcesses(run_, -1)) kill(p, SIGKILL);  // never leave one behind
  }
  static constexpr int kRunning = -1000;

  int pid() const { return pid_; }
  const std::string& run() const { return run_; }
  std::string log() const { return ReadText(log_); }
  std::string credentials() const { return ReadText(config_ + "/latchkey/credentials"); }

  // The first match of `pattern`'s group 1 in up's output, waiting up to `deadline`.
  std::string Grab(const std::string& pattern, seconds deadline = seconds(120)) {
    const std::regex re(pattern);
    std::smatch m;
    const auto until = Clock::now() + deadline;
    while (Clock::now() < until) {
      Remember();
      const std::string text = log();
      if (std::regex_search(text, m, re)) return m[1].str();
      std::this_thread::sleep_for(milliseconds(20));
    }
    return "";
  }
  std::string Job() { return Grab("job          (\\S+)"); }
  // Until rank 0 has recorded `step` (the job runs).
  bool WaitForStep(int step) {
    const std::string needle = "\"step\":" + std::to_string(step);
    const auto until = Clock::now() + seconds(240);
    while (Clock::now() < until) {
      Remember();
      if (ReadText(run_ + "/steps-0.jsonl").find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }
  void Signal(int sig, bool to_group) {
    Remember();
    signalled_ = Clock::now();
    ASSERT_EQ(kill(to_group ? -pid_ : pid_, sig), 0);
  }
  // up's exit code, waiting what is left of the budget.
  int Wait() {
    if (code_ == kRunning) {
      const auto left =
          std::chrono::duration_cast<milliseconds>(signalled_ + kCleanupBudget - Clock::now());
      code_ = WaitProcess(pid_, std::max(left, milliseconds(1)));
    }
    return code_;
  }

  // Within the budget: no process of the run alive (the pids up printed, its children seen
  // while it ran, anything naming the run folder), and no shm segment naming one of them.
  void ExpectNothingLeft() {
    const std::string text = log();
    std::set<int> pids = children_;
    const std::regex pid_re("(?:db [^\n]*, pid|worker [0-9]+ +pid) ([0-9]+)");
    for (std::sregex_iterator it(text.begin(), text.end(), pid_re), end; it != end; ++it) {
      pids.insert(std::stoi((*it)[1]));
    }
    EXPECT_GE(pids.size(), 1u) << text;
    std::set<int> alive;
    do {
      alive.clear();
      for (int p : pids) {
        if (ProcessAlive(p)) alive.insert(p);
      }
      for (int p : LiveProcesses(run_, -1)) alive.insert(p);
      if (alive.empty()) break;
      std::this_thread::sleep_for(milliseconds(50));
    } while (Clock::now() < signalled_ + kCleanupBudget);
    for (int p : alive) ADD_FAILURE() << "pid " << p << " of the run still alive\n" << text;
    for (const auto& [name, owners] : ShmSegmentPids()) {
      for (int p : owners) {
        EXPECT_EQ(pids.count(p), 0u) << "/dev/shm/" << name << " belongs to pid " << p;
      }
    }
  }

 private:
  void Remember() {
    for (int p : LiveProcesses(run_, pid_)) children_.insert(p);
  }

  std::string run_;
  std::string log_;
  std::string config_;
  int pid_ = -1;
  int code_ = kRunning;
  std::set<int> children_;
  Clock::time_point signalled_ = Clock::now();
};

void ExpectCancelled(const UpRun& up, const std::string& job, const std::string& why) {
  const JobRow row = ReadJob(up.run() + "/coordinator.db", job);
  EXPECT_EQ(row.state, 5) << "job " << job << ": " << row.reason << "\n" << up.log();
  EXPECT_NE(row.reason.find(why), std::string::npos) << row.reason;
}

// Ctrl-C before any worker has joined: the job is cancelled at once (before, `up` waited a
// minute for a coordinator it had stopped itself, and left the job pending).
TEST(UpSignals, InterruptWhilePending) {
  const ScopedTempDir dir("up-signals-pending");
  UpRun up(dir.path());
  const std::string job = up.Job();
  ASSERT_FALSE(job.empty()) << up.log();
  up.Signal(SIGINT, /*to_group=*/false);
  EXPECT_EQ(up.Wait(), 11) << up.log();
  up.ExpectNothingLeft();
  ExpectCancelled(up, job, "interrupted by latchkey up (SIGINT)");
  // It was still pending: the coordinator's log has the transition.
  const std::string coordinator_log = ReadText(up.run() + "/coordinator.log");
  EXPECT_NE(coordinator_log.find(job + ": pending -> cancelled"), std::string::npos)
      << coordinator_log;
}

// Two Ctrl-C from the terminal 0.1 s apart, while the job runs: the terminal signals the whole
// foreground group (before, the coordinator died of the first one before `up` could cancel the
// job, which stayed running).
TEST(UpSignals, TwoInterruptsFromTheTerminal) {
  const ScopedTempDir dir("up-signals-twice");
  UpRun up(dir.path());
  const std::string job = up.Job();
  ASSERT_FALSE(job.empty()) << up.log();
  ASSERT_TRUE(up.WaitForStep(1)) << up.log();
  up.Signal(SIGINT, /*to_group=*/true);
  std::this_thread::sleep_for(milliseconds(100));
  ASSERT_EQ(kill(-up.pid(), SIGINT), 0);
  EXPECT_EQ(up.Wait(), 11) << up.log();
  EXPECT_EQ(up.log().find("UNAVAILABLE"), std::string::npos) << up.log();
  up.ExpectNothingLeft();
  ExpectCancelled(up, job, "interrupted by latchkey up (SIGINT)");
}

// The terminal closes (SIGHUP to its foreground group) while the job runs.
TEST(UpSignals, TerminalClosed) {
  const ScopedTempDir dir("up-signals-hup");
  UpRun up(dir.path());
  const std::string job = up.Job();
  ASSERT_FALSE(job.empty()) << up.log();
  ASSERT_TRUE(up.WaitForStep(1)) << up.log();
  up.Signal(SIGHUP, /*to_group=*/true);
  EXPECT_EQ(up.Wait(), 11) << up.log();
  up.ExpectNothingLeft();
  ExpectCancelled(up, job, "interrupted by latchkey up (SIGHUP)");
}

// SIGTERM to `up` alone (a process manager, `kill PID`).
TEST(UpSignals, TerminatedWhileRunning) {
  const ScopedTempDir dir("up-signals-term");
  UpRun up(dir.path());
  const std::string job = up.Job();
  ASSERT_FALSE(job.empty()) << up.log();
  ASSERT_TRUE(up.WaitForStep(1)) << up.log();
  up.Signal(SIGTERM, /*to_group=*/false);
  EXPECT_EQ(up.Wait(), 11) << up.log();
  up.ExpectNothingLeft();
  ExpectCancelled(up, job, "interrupted by latchkey up (SIGTERM)");
}

// kill -9 of `up`: nothing of it runs any more, yet its children die with it (their
// parent-death signal) and its coordinator records the job cancelled as it stops.
TEST(UpSignals, KilledWithSigkill) {
  const ScopedTempDir dir("up-signals-kill");
  UpRun up(dir.path());
  const std::string job = up.Job();
  ASSERT_FALSE(job.empty()) << up.log();
  ASSERT_TRUE(up.WaitForStep(1)) << up.log();
  up.Signal(SIGKILL, /*to_group=*/false);
  EXPECT_EQ(up.Wait(), 128 + SIGKILL);
  up.ExpectNothingLeft();
  ExpectCancelled(up, job, "the coordinator stopped (signal 15");
}

// Ctrl-C while the coordinator does not answer (stopped with SIGSTOP here; hung, in life): `up`
// gives up on cancelling after a few seconds, stops everything (a stopped coordinator is
// continued, so it acts on SIGTERM) and the coordinator's --cancel-on-shutdown records the
// cancellation.
TEST(UpSignals, InterruptWhileTheCoordinatorDoesNotAnswer) {
  const ScopedTempDir dir("up-signals-stopped");
  UpRun up(dir.path());
  const std::string job = up.Job();
  ASSERT_FALSE(job.empty()) << up.log();
  ASSERT_TRUE(up.WaitForStep(1)) << up.log();
  const std::string coordinator = up.Grab("db [^\n]*, pid ([0-9]+)\\)");
  ASSERT_FALSE(coordinator.empty()) << up.log();
  // up keeps its coordinator's token in the user's credentials file while it runs ...
  const std::string address = up.Grab("coordinator  (127\\.0\\.0\\.1:[0-9]+)");
  ASSERT_FALSE(address.empty()) << up.log();
  ASSERT_NE(up.credentials().find("\"" + address + "\""), std::string::npos) << up.credentials();
  ASSERT_EQ(kill(std::stoi(coordinator), SIGSTOP), 0);
  up.Signal(SIGINT, /*to_group=*/false);
  EXPECT_EQ(up.Wait(), 11) << up.log();
  up.ExpectNothingLeft();
  ExpectCancelled(up, job, "the coordinator stopped (signal 15");
  // ... and removes the entry although it gave up on the coordinator (its quick exit).
  EXPECT_EQ(up.credentials().find("\"" + address + "\""), std::string::npos) << up.credentials();
  kill(std::stoi(coordinator), SIGCONT);  // should the test have failed with it still there
}

// The coordinator stopped (SIGSTOP: a frozen VM, a long stall) for 45 s, longer than up's 10 s
// liveness timeout and the 20 s hang timeout: on waking it notices it did not run and judges no
// rank on the gap, so the job goes on and succeeds without a restart (before, it named a healthy
// rank lost, killed the attempt and spent a restart).
TEST(UpSignals, CoordinatorStoppedLongerThanEveryTimeoutSpendsNoRestart) {
  const ScopedTempDir dir("up-signals-paused");
  // Timeouts shorter than up's defaults (liveness 10 s, collectives 30 s) so the stop can outlast
  // each of them, and the built-in spec's 20 s hang timeout, in 25 s rather than 45 s. Liveness
  // stays at 5 s, five heartbeat periods, so a loaded machine does not miss it before the stop.
  UpRun up(dir.path(), {"--liveness-timeout", "5", "--collective-timeout", "8"});
  const std::string job = up.Job();
  ASSERT_FALSE(job.empty()) << up.log();
  ASSERT_TRUE(up.WaitForStep(1)) << up.log();
  const std::string coordinator = up.Grab("db [^\n]*, pid ([0-9]+)\\)");
  ASSERT_FALSE(coordinator.empty()) << up.log();
  const int pid = std::stoi(coordinator);
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  std::this_thread::sleep_for(seconds(25));
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  EXPECT_EQ(WaitProcess(up.pid(), seconds(240)), 0) << up.log();
  const std::string text = up.log();
  EXPECT_TRUE(std::regex_search(text, std::regex("restarts +0 \\(attempt 1\\)"))) << text;
  const JobRow row = ReadJob(up.run() + "/coordinator.db", job);
  EXPECT_EQ(row.state, 3) << row.reason;
  const std::string coordinator_log = ReadText(up.run() + "/coordinator.log");
  EXPECT_NE(coordinator_log.find("coordinator did not run for 2"), std::string::npos)
      << coordinator_log;
  EXPECT_EQ(coordinator_log.find("stalled"), std::string::npos) << coordinator_log;
  EXPECT_EQ(coordinator_log.find("missed the liveness deadline"), std::string::npos)
      << coordinator_log;
}

// The coordinator's side on its own: a stop signal (SIGHUP here, which a closed terminal sends)
// is a clean shutdown, and with --cancel-on-shutdown the job it has not finished is cancelled,
// naming the signal; without the flag the job stays as it was, to resume on the next start.
TEST(UpSignals, CoordinatorCancelsItsJobsOnShutdownOnlyWhenAsked) {
  for (const bool cancel : {true, false}) {
    const ScopedTempDir dir("up-signals-coordinator");
    const std::string d = dir.path();
    std::ofstream(d + "/spec.json") << SpecObject(SpecParams{}).dump(2);
    std::vector<std::string> extra;
    if (cancel) extra.push_back("--cancel-on-shutdown");
    const CoordinatorProcess c = StartCoordinator(LATCHKEY_COORDINATOR_BIN, d, extra,
                                                  d + "/coordinator.log", d + "/coordinator.db");
    ASSERT_GT(c.port, 0) << ReadText(d + "/coordinator.log");
    const int pid = c.pid;
    const std::string address = c.address();
    const Captured sub = RunAndCapture(
        {LATCHKEY_CLI_BIN, "--coordinator", address, "submit", d + "/spec.json"}, seconds(30));
    ASSERT_EQ(sub.exit_code, 0) << sub.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(sub.output, m, std::regex("(job-[0-9]+)"))) << sub.output;
    ASSERT_EQ(kill(pid, SIGHUP), 0);
    EXPECT_EQ(WaitProcess(pid, seconds(10)), 0) << ReadText(d + "/coordinator.log");
    const JobRow row = ReadJob(d + "/coordinator.db", m[1]);
    if (cancel) {
      EXPECT_EQ(row.state, 5) << row.reason;
      EXPECT_NE(row.reason.find("the coordinator stopped (signal 1, Hangup)"), std::string::npos)
          << row.reason;
    } else {
      EXPECT_EQ(row.state, 1) << row.reason;  // pending, as it was
    }
  }
}

// One worker per rank: `--workers` other than the spec's world size is refused at once, naming
// both, with the invalid-value exit code, before anything is started.
TEST(UpSignals, WorkersOtherThanTheWorldSizeAreRefused) {
  const ScopedTempDir dir("up-signals-workers");
  for (const std::string n : {"1", "3"}) {
    const auto start = Clock::now();
    const Captured c = RunAndCapture(
        {LATCHKEY_CLI_BIN, "up", "--workers", n, "--run-dir", dir.path() + "/run-" + n},
        seconds(30));
    EXPECT_EQ(c.exit_code, 3) << c.output;
    EXPECT_NE(
        c.output.find("--workers " + n + ": the spec's world size (latchkey.world_size) is 2"),
        std::string::npos)
        << c.output;
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
    EXPECT_FALSE(std::ifstream(dir.path() + "/run-" + n + "/coordinator.db").good());
    for (int p : LiveProcesses(dir.path() + "/run-" + n, -1)) kill(p, SIGKILL);  // a run it began
  }
}

}  // namespace
}  // namespace latchkey::testing
