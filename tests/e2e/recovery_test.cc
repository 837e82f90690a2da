// Fault tolerance end to end (docs/fault-tolerance.md): `latchkey up` runs a DP 2 x TP 2 ZeRO-1
// AdamW job with resumable checkpoints while the test kills (-9) or stops (SIGSTOP) one of its
// real processes, and the job still ends as an uninterrupted `up` run of the same spec does:
// every step's loss (the last JSONL record of each step, every rank) and the final
// model.safetensors byte for byte.
//
// LATCHKEY_TEST_SEED picks the killed rank and step (printed; default fixed).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/coordinator_process.h"
#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"

namespace latchkey::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kWorld = 4;  // DP 2 x TP 2
constexpr int kSteps = 12;
constexpr int kCheckpointEvery = 3;  // committed after steps 2, 5, 8, 11

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

nlohmann::json RecoverySpec(double hang_timeout_s = 0) {
  ModelShape model;
  model.n_embd = 128;
  model.n_positions = 64;
  SpecParams p;
  p.model = ModelJson(model);
  p.micro_batch = 2;
  p.gas = 4;
  p.zero_stage = 1;
  p.optimizer = "AdamW";
  p.lr = 3e-3;
  p.tp = 2;
  p.seq_len = 64;
  p.steps = kSteps;
  p.seed = 17;
  p.world_size = kWorld;
  p.data = SyntheticData(9);
  // Relative: each run's checkpoints land beside its own spec file.
  p.extra_latchkey = {{"checkpoint", {{"dir", "ckpt"}, {"every_steps", kCheckpointEvery}}}};
  // A recovery waits up to 30 s for every rank to rejoin (not up's 10 s liveness timeout): a
  // restarted worker loads libtorch and forms its groups again, which takes longer than 10 s
  // when the machine runs other tests beside this one; no test here is about that window.
  p.extra_latchkey["rejoin_timeout_seconds"] = 30;
  if (hang_timeout_s > 0) p.extra_latchkey["hang_timeout_seconds"] = hang_timeout_s;
  return SpecObject(p);
}

// Each step's loss, from the last record of the step (a restarted rank appends).
std::map<int64_t, double> LossByStep(const std::string& jsonl) {
  std::map<int64_t, double> out;
  for (const auto& r : StepRecords(jsonl)) out[r["step"].get<int64_t>()] = r["loss"].get<double>();
  return out;
}

std::string Hex(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", v);
  return buf;
}

// One `latchkey up` of `spec` in <dir>/run; stopped (SIGTERM, then SIGKILL) if still running when
// the test ends, and any process it stopped is continued first.
class Up {
 public:
  Up(const std::string& dir, const nlohmann::json& spec, std::vector<std::string> extra_args = {},
     std::vector<std::string> env = {})
      : dir_(dir), run_(dir + "/run") {
    std::ofstream(dir + "/spec.json") << spec.dump(2);
    std::vector<std::string> args = {LATCHKEY_CLI_BIN,   "up",        "--spec",
                                     dir + "/spec.json", "--run-dir", run_};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    pid_ = StartProcess(args, env, log_path());
  }
  ~Up() {
    for (int p : stopped_) kill(p, SIGCONT);
    if (pid_ > 0 && code_ == kRunning) {
      kill(pid_, SIGTERM);
      WaitProcess(pid_, seconds(60));
    }
  }
  static constexpr int kRunning = -1000;

  std::string log_path() const { return dir_ + "/up.log"; }
  std::string log() const { return ReadText(log_path()); }
  const std::string& run() const { return run_; }
  std::string jsonl(int rank) const { return run_ + "/steps-" + std::to_string(rank) + ".jsonl"; }

  int Wait(seconds deadline = seconds(400)) {
    if (code_ == kRunning) code_ = WaitProcess(pid_, deadline);
    return code_;
  }

  // The pid up printed for `rank`'s start number `restart` (0: the first start), waiting for
  // the line; -1 if it did not come within `deadline`.
  int WorkerPid(int rank, int restart, seconds deadline = seconds(180)) const {
    const std::regex re(
        restart == 0
            ? "worker " + std::to_string(rank) + " +pid ([0-9]+)  metrics [^\n]*\\(log "
            : "worker " + std::to_string(rank) + " +pid ([0-9]+)  metrics [^\n]*\\(restart " +
                  std::to_string(restart) + "\\)");
    std::smatch m;
    const std::string text = WaitForFile(
        log_path(), [&](const std::string& t) { return std::regex_search(t, m, re); }, deadline);
    if (!std::regex_search(text, m, re)) return -1;
    return std::stoi(m[1]);
  }

  // "127.0.0.1:PORT" and the job id, from up's first lines.
  std::string Coordinator() const { return Grab("coordinator  (127\\.0\\.0\\.1:[0-9]+)"); }
  std::string Job() const { return Grab("job          (\\S+)"); }

  // Waits until rank 0's JSONL has a record of step `step`.
  bool WaitForStep(int64_t step, seconds deadline = seconds(240)) const {
    const auto until = Clock::now() + deadline;
    while (Clock::now() < until) {
      for (const auto& r : StepRecords(jsonl(0))) {
        if (r["step"].get<int64_t>() >= step) return true;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

  void Stopped(int pid) { stopped_.push_back(pid); }

 private:
  std::string Grab(const std::string& pattern) const {
    const std::regex re(pattern);
    std::smatch m;
    const std::string text = WaitForFile(
        log_path(), [&](const std::string& t) { return std::regex_search(t, m, re); }, seconds(60));
    return std::regex_search(text, m, re) ? m[1].str() : std::string();
  }

  std::string dir_;
  std::string run_;
  int pid_ = -1;
  int code_ = kRunning;
  std::vector<int> stopped_;
};

// Baselines of earlier builds, unused for an hour, are removed.
void RemoveStaleBaselines(const std::string& keep) {
  std::error_code ec;
  const auto hour_ago = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path(), ec)) {
    const std::string path = e.path().string();
    if (path == keep || !e.is_directory(ec) ||
        e.path().filename().string().rfind("latchkey-recovery-baseline-", 0) != 0 ||
        fs::last_write_time(e.path(), ec) > hour_ago) {
      continue;
    }
    const int lock = ::open((path + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
    if (lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) == 0) {
      fs::remove_all(e.path(), ec);
      fs::remove(path + ".lock", ec);
    }
    if (lock >= 0) ::close(lock);
  }
}

// The uninterrupted run of `spec`, made once per build and spec and shared by the tests (a lock
// file serializes tests that run at the same time). Returns its run folder.
std::string Baseline(const nlohmann::json& spec) {
  struct stat cli = {};
  struct stat worker = {};
  stat(LATCHKEY_CLI_BIN, &cli);
  stat(WorkerBinary().c_str(), &worker);
  const std::string key = spec.dump() + std::to_string(cli.st_mtime) + ":" +
                          std::to_string(worker.st_mtime) + ":" + std::to_string(worker.st_size);
  const std::string dir =
      (fs::temp_directory_path() /
       ("latchkey-recovery-baseline-" + std::to_string(std::hash<std::string>{}(key))))
          .string();
  const int lock = ::open((dir + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
  flock(lock, LOCK_EX);
  if (!fs::exists(dir + "/done")) {
    RemoveStaleBaselines(dir);
    fs::remove_all(dir);
    fs::create_directories(dir);
    Up up(dir, spec);
    const int code = up.Wait();
    if (code == 0 && fs::exists(dir + "/run/final/model.safetensors")) {
      std::ofstream(dir + "/done") << "ok\n";
    } else {
      ADD_FAILURE() << "the uninterrupted run failed (exit " << code << "):\n" << up.log();
    }
  }
  flock(lock, LOCK_UN);
  ::close(lock);
  return dir + "/run";
}

// Every rank's loss of every step and the final weights equal the uninterrupted run's.
void ExpectSameAsBaseline(const std::string& run, const std::string& baseline,
                          const std::string& log) {
  for (int r = 0; r < kWorld; ++r) {
    const std::string name = "/steps-" + std::to_string(r) + ".jsonl";
    const auto got = LossByStep(run + name);
    const auto want = LossByStep(baseline + name);
    ASSERT_EQ(want.size(), static_cast<size_t>(kSteps)) << "baseline rank " << r;
    ASSERT_EQ(got.size(), want.size()) << "rank " << r << "\n" << log;
    for (const auto& [step, loss] : want) {
      ASSERT_TRUE(got.count(step)) << "rank " << r << " step " << step;
      EXPECT_EQ(Hex(got.at(step)), Hex(loss)) << "rank " << r << " step " << step;
    }
  }
  const std::string a = ReadText(run + "/final/model.safetensors");
  const std::string b = ReadText(baseline + "/final/model.safetensors");
  ASSERT_FALSE(b.empty());
  ASSERT_FALSE(a.empty()) << "no final/model.safetensors\n" << log;
  EXPECT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b) << "final/model.safetensors differs from the uninterrupted run's";
}

// up's summary line "restarts  N (attempt A)".
void ExpectSummaryRestarts(const std::string& log, int restarts) {
  EXPECT_TRUE(
      std::regex_search(log, std::regex("\n  restarts +" + std::to_string(restarts) +
                                        " \\(attempt " + std::to_string(restarts + 1) + "\\)\n")))
      << log;
}

struct Draw {
  int rank;
  int64_t step;
};

// The seeded choice of a rank and the step after which it is hit, in [lo, hi].
Draw DrawFault(const std::string& test, int64_t lo, int64_t hi) {
  const char* env = std::getenv("LATCHKEY_TEST_SEED");
  const uint32_t seed = env ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : 20261201u;
  std::mt19937 rng(seed + static_cast<uint32_t>(std::hash<std::string>{}(test)));
  Draw d;
  d.rank = std::uniform_int_distribution<int>(0, kWorld - 1)(rng);
  d.step = std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  std::printf("[%s] seed %u: rank %d after step %lld\n", test.c_str(), seed, d.rank,
              static_cast<long long>(d.step));
  return d;
}

// Seconds from `since` until the first JSONL record the job's new attempt wrote (any rank): a
// re-run of a step already recorded, or any record written once up saw attempt 2. -1: none in
// `deadline`.
double FirstRecordAfter(const Up& up, Clock::time_point since, seconds deadline) {
  std::vector<int64_t> max_step(kWorld, -1);  // per rank: a re-run repeats one of its own steps
  std::vector<size_t> seen(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    const auto rows = StepRecords(up.jsonl(r));
    seen[static_cast<size_t>(r)] = rows.size();
    for (const auto& row : rows) {
      max_step[static_cast<size_t>(r)] =
          std::max(max_step[static_cast<size_t>(r)], row["step"].get<int64_t>());
    }
  }
  while (Since(since) < deadline.count()) {
    const bool new_attempt = up.log().find("recovery     attempt 2") != std::string::npos;
    for (int r = 0; r < kWorld; ++r) {
      const auto rows = StepRecords(up.jsonl(r));
      auto& top = max_step[static_cast<size_t>(r)];
      for (size_t i = seen[static_cast<size_t>(r)]; i < rows.size(); ++i) {
        const int64_t step = rows[i]["step"].get<int64_t>();
        if (new_attempt || step <= top) return Since(since);
        top = std::max(top, step);  // the old attempt's last steps, finished after the kill
      }
      seen[static_cast<size_t>(r)] = rows.size();
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  return -1;
}

// Scratch folders are removed after the test (kept with LATCHKEY_KEEP_TEST_DIRS set).

// What the job's database says once up is done: a coordinator started on a copy of it answers
// `latchkey --json status` (first line) and `latchkey audit`.
struct Afterwards {
  nlohmann::json status;
  std::string status_text;  // `latchkey status`
  std::string audit;
};
Afterwards ReadBack(const std::string& run, const std::string& job) {
  Afterwards out;
  const ScopedTempDir scratch("recovery-readback");
  const std::string dir = scratch.path();
  fs::copy_file(run + "/coordinator.db", dir + "/coordinator.db");
  const ScopedCoordinator coordinator(LATCHKEY_COORDINATOR_BIN, dir, {}, dir + "/coordinator.log",
                                      dir + "/coordinator.db");
  if (coordinator.ok()) {
    const std::string address = coordinator.address();
    const Captured st = RunAndCapture(
        {LATCHKEY_CLI_BIN, "--coordinator", address, "--json", "status", job}, seconds(30));
    out.status = nlohmann::json::parse(st.output.substr(0, st.output.find('\n')), nullptr, false);
    out.status_text =
        RunAndCapture({LATCHKEY_CLI_BIN, "--coordinator", address, "status", job}, seconds(30))
            .output;
    out.audit =
        RunAndCapture({LATCHKEY_CLI_BIN, "--coordinator", address, "audit", job}, seconds(30))
            .output;
  }
  return out;
}

// The job's record: `recoveries` recoveries, each an audit event "recovery" of its attempt.
void ExpectRecorded(const Up& up, int recoveries, const std::string& cause) {
  const Afterwards a = ReadBack(up.run(), up.Job());
  ASSERT_TRUE(a.status.is_object()) << a.audit;
  EXPECT_EQ(a.status["attempt"], recoveries + 1) << a.status.dump();
  EXPECT_EQ(a.status["restarts"], recoveries) << a.status.dump();
  EXPECT_EQ(a.status["stalled"], nlohmann::json::array()) << a.status.dump();
  EXPECT_EQ(a.status["last_checkpoint_step"], kSteps - 1) << a.status.dump();  // after step 11
  EXPECT_EQ(a.status["determinism_violations"], 0) << a.status.dump();
  EXPECT_NE(a.status.value("last_recovery_reason", std::string()).find(cause), std::string::npos)
      << a.status.dump();
  EXPECT_NE(a.status_text.find("attempt:      " + std::to_string(recoveries + 1) + " (restarts " +
                               std::to_string(recoveries) + " of "),
            std::string::npos)
      << a.status_text;
  EXPECT_NE(a.status_text.find("checkpoint:   last committed after step 11\n"), std::string::npos)
      << a.status_text;
  EXPECT_NE(a.status_text.find("recovery:     "), std::string::npos) << a.status_text;
  EXPECT_NE(a.status_text.find("determinism:  0 violations"), std::string::npos) << a.status_text;
  for (int attempt = 2; attempt <= recoveries + 1; ++attempt) {
    EXPECT_TRUE(
        std::regex_search(a.audit, std::regex("\n\\S+ +" + std::to_string(attempt) +
                                              " +recovery +attempt " + std::to_string(attempt))))
        << a.audit;
  }
}

// The attempt after a fault at `fault_step` (the last step the test saw recorded before it)
// resumed from the newest checkpoint committed by then: a checkpoint step (after steps 2, 5, 8),
// no later than `fault_step` and no earlier than the newest one before it. A recovery from the
// start, or from an older checkpoint than the newest, fails here although training being
// deterministic it would still end with the uninterrupted run's numbers.
void ExpectResumedFromTheNewestCheckpoint(const std::string& log, int64_t fault_step) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      log, m, std::regex("recovery +attempt 2 [^\n]* from the checkpoint after step ([0-9]+)")))
      << "no resume from a checkpoint in up's output\n"
      << log;
  const int64_t resumed = std::stoll(m[1]);
  int64_t newest = -1;  // the newest checkpoint step strictly before the fault's step
  for (int64_t s = kCheckpointEvery - 1; s < fault_step; s += kCheckpointEvery) newest = s;
  EXPECT_EQ((resumed + 1) % kCheckpointEvery, 0) << "resumed after step " << resumed;
  EXPECT_GE(resumed, newest) << "fault after step " << fault_step << "\n" << log;
  EXPECT_LE(resumed, fault_step) << log;
}

TEST(Recovery, KillNineRecovers) {
  const nlohmann::json spec = RecoverySpec();
  const std::string baseline = Baseline(spec);
  const Draw d = DrawFault("KillNineRecovers", 3, 7);
  const ScopedTempDir scratch("recovery-kill9");
  const std::string dir = scratch.path();
  constexpr double kCollectiveTimeout = 60;  // twice up's 30 s, so a wait for it shows below
  Up up(dir, spec, {"--collective-timeout", "60"});
  const int victim = up.WorkerPid(d.rank, 0);
  ASSERT_GT(victim, 0) << up.log();
  // A `latchkey watch` beside it (the token from the credentials file up wrote) shows the
  // recovery's cause next to `recovering`.
  const int watch =
      StartProcess({LATCHKEY_CLI_BIN, "--coordinator", up.Coordinator(), "watch", up.Job()}, {},
                   dir + "/watch.log");
  ASSERT_TRUE(up.WaitForStep(d.step)) << up.log();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto killed = Clock::now();
  const double recovery_s = FirstRecordAfter(up, killed, seconds(120));
  const int code = up.Wait();
  const std::string log = up.log();
  ASSERT_EQ(code, 0) << log;
  EXPECT_EQ(WaitProcess(watch, seconds(60)), 0) << ReadText(dir + "/watch.log");
  const std::string watched = ReadText(dir + "/watch.log");
  EXPECT_TRUE(std::regex_search(
      watched, std::regex(" recovering \\(rank " + std::to_string(d.rank) + "[ :][^\n]*\\)")))
      << watched;
  std::printf("[KillNineRecovers] rank %d killed after step %lld: recovery %.2f s (goal 10 s)\n",
              d.rank, static_cast<long long>(d.step), recovery_s);
  EXPECT_GT(recovery_s, 0) << "no record was written after the kill\n" << log;
  // The bound guards against survivors that wait out their collective timeout on the dead peer
  // (60 s) instead of being aborted by the recovery, whose restarted rank joins within
  // rejoin_timeout_seconds (30 s; goal 10 s) or not at all: 15 s of room on either side.
  EXPECT_LT(recovery_s, kCollectiveTimeout - 15.0) << log;
  EXPECT_GT(up.WorkerPid(d.rank, 1, seconds(1)), 0) << "no restart line for rank " << d.rank << "\n"
                                                    << log;
  ExpectResumedFromTheNewestCheckpoint(log, d.step);
  ExpectSummaryRestarts(log, 1);
  ExpectSameAsBaseline(up.run(), baseline, log);
  ExpectRecorded(up, 1, "rank " + std::to_string(d.rank) + " ");
}

TEST(Recovery, CoordinatorKilledDuringRecovery) {
  const nlohmann::json spec = RecoverySpec();
  const std::string baseline = Baseline(spec);
  const Draw d = DrawFault("CoordinatorKilledDuringRecovery", 3, 7);
  const ScopedTempDir scratch("recovery-coord");
  const std::string dir = scratch.path();
  const std::string once = dir + "/coordinator-crashed";
  // up's children inherit its environment: the coordinator kills itself once, right after it
  // persisted the new attempt.
  Up up(dir, spec, {},
        {"LATCHKEY_TEST_CRASH=recovery.after_attempt", "LATCHKEY_TEST_CRASH_ONCE=" + once});
  const int victim = up.WorkerPid(d.rank, 0);
  ASSERT_GT(victim, 0) << up.log();
  ASSERT_TRUE(up.WaitForStep(d.step)) << up.log();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const int code = up.Wait();
  const std::string log = up.log();
  EXPECT_TRUE(fs::exists(once)) << "the coordinator never reached recovery.after_attempt\n" << log;
  ASSERT_EQ(code, 0) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex("coordinator  pid [0-9]+  killed by signal 9")))
      << log;
  EXPECT_TRUE(std::regex_search(
      log, std::regex("coordinator  127\\.0\\.0\\.1:[0-9]+  pid [0-9]+  \\(restart 1\\)")))
      << log;
  ExpectSummaryRestarts(log, 1);
  ExpectSameAsBaseline(up.run(), baseline, log);
  ExpectRecorded(up, 1, "rank " + std::to_string(d.rank) + " ");
}

// A rank killed at crash point `point` of the second checkpoint (after step 5; the first is
// after step 2): the partial checkpoint of step 5 is not used, the job goes back to the one after
// step 2, runs steps 3 to 5 again and ends as the uninterrupted run.
void CrashInCheckpoint(const std::string& name, const std::string& point, int rank) {
  const nlohmann::json spec = RecoverySpec();
  const std::string baseline = Baseline(spec);
  const ScopedTempDir scratch(name);
  const std::string dir = scratch.path();
  const std::string once = dir + "/crashed";
  constexpr int kCrashStep = 5;
  Up up(dir, spec, {},
        {"LATCHKEY_TEST_CRASH=" + point, "LATCHKEY_TEST_CRASH_RANK=" + std::to_string(rank),
         "LATCHKEY_TEST_CRASH_STEP=" + std::to_string(kCrashStep),
         "LATCHKEY_TEST_CRASH_ONCE=" + once});
  const int code = up.Wait();
  const std::string log = up.log();
  ASSERT_TRUE(fs::exists(once)) << "rank " << rank << " never reached " << point << "\n" << log;
  ASSERT_EQ(code, 0) << log;
  std::map<int64_t, int> records;
  for (const auto& r : StepRecords(up.jsonl(0))) ++records[r["step"].get<int64_t>()];
  for (int64_t s = 3; s < kCrashStep; ++s) {
    EXPECT_EQ(records[s], 2) << "step " << s << " should have run twice\n" << log;
  }
  EXPECT_GE(records[kCrashStep], 1) << log;  // its first record may precede the checkpoint
  EXPECT_NE(log.find("from the checkpoint after step 2"), std::string::npos) << log;
  EXPECT_GT(up.WorkerPid(rank, 1, seconds(1)), 0) << log;
  ExpectSummaryRestarts(log, 1);
  ExpectSameAsBaseline(up.run(), baseline, log);
  ExpectRecorded(up, 1, "rank " + std::to_string(rank) + " ");
}

// Rank 1 dies with its file written, nothing confirmed.
TEST(Recovery, CrashDuringCheckpoint) {
  CrashInCheckpoint("recovery-ckpt", "checkpoint.after_rank_files", 1);
}

// Rank 0 dies with every file confirmed, just before it renames the manifest into place.
TEST(Recovery, CrashBeforeTheManifestIsCommitted) {
  CrashInCheckpoint("recovery-commit", "checkpoint.before_commit", 0);
}

TEST(Recovery, SigstopIsNamedAndRecovered) {
  constexpr double kHang = 4;       // latchkey.hang_timeout_seconds
  constexpr double kHeartbeat = 1;  // up's heartbeat interval
  const Draw d = DrawFault("SigstopIsNamedAndRecovered", 3, 6);
  const nlohmann::json spec = RecoverySpec(kHang);
  const std::string baseline = Baseline(spec);
  const ScopedTempDir scratch("recovery-sigstop");
  const std::string dir = scratch.path();
  Up up(dir, spec);
  const int victim = up.WorkerPid(d.rank, 0);
  ASSERT_GT(victim, 0) << up.log();
  const std::string coordinator = up.Coordinator();
  const std::string job = up.Job();
  ASSERT_FALSE(coordinator.empty() || job.empty()) << up.log();
  ASSERT_TRUE(up.WaitForStep(d.step)) << up.log();
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  up.Stopped(victim);
  const auto stopped = Clock::now();
  int64_t victim_last = -1;  // the last step the stopped rank recorded
  for (const auto& r : StepRecords(up.jsonl(d.rank))) {
    victim_last = std::max(victim_last, r["step"].get<int64_t>());
  }
  nlohmann::json named;
  double named_s = -1;
  double look_s = 0;  // the longest look (a CLI process each; slow on a loaded machine)
  std::string last;
  while (Since(stopped) < 60 && named.is_null()) {
    const auto look = Clock::now();
    const Captured st = RunAndCapture(
        {LATCHKEY_CLI_BIN, "--coordinator", coordinator, "--json", "status", job}, seconds(10));
    look_s = std::max(look_s, Since(look));
    last = st.output;
    const nlohmann::json j =
        nlohmann::json::parse(st.output.substr(0, st.output.find('\n')), nullptr, false);
    if (j.is_object()) {
      EXPECT_TRUE(j["attempt"].is_number()) << st.output;
      EXPECT_TRUE(j["restarts"].is_number()) << st.output;
      EXPECT_TRUE(j["last_checkpoint_step"].is_number()) << st.output;
      EXPECT_TRUE(j["stalled"].is_array()) << st.output;
      for (const auto& s : j.value("stalled", nlohmann::json::array())) {
        if (s.value("rank", -1) == d.rank) {
          named = s;
          named_s = Since(stopped);
        }
      }
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_FALSE(named.is_null()) << "rank " << d.rank << " never listed as stalled; last status:\n"
                                << last << "\n"
                                << up.log();
  std::printf(
      "[SigstopIsNamedAndRecovered] rank %d stopped after step %lld: named stalled after "
      "%.2f s: %s\n",
      d.rank, static_cast<long long>(d.step), named_s, named.dump().c_str());
  // The hang timeout plus two heartbeats, and the time between two looks (the longest look and
  // the 0.1 s pause), measured rather than assumed.
  EXPECT_LT(named_s, kHang + 2 * kHeartbeat + look_s + 0.1)
      << named.dump() << "; longest look " << look_s << " s";
  // A silent rank is named at its last heartbeat's position (up to a heartbeat old): a window it
  // had reached, at most the one after its last recorded step.
  EXPECT_GE(named.value("window", -2), 0) << named.dump();
  EXPECT_LE(named.value("window", 1 << 30), victim_last + 1) << named.dump();
  EXPECT_FALSE(named.value("where", std::string()).empty()) << named.dump();
  EXPECT_TRUE(named["micro_batch"].is_number()) << named.dump();
  EXPECT_TRUE(named["seconds"].is_number()) << named.dump();

  const int code = up.Wait();
  const std::string log = up.log();
  ASSERT_EQ(code, 0) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex("worker " + std::to_string(d.rank) + " +pid " +
                                                std::to_string(victim) + "  stalled: ")))
      << log;
  EXPECT_GT(up.WorkerPid(d.rank, 1, seconds(1)), 0) << log;
  ExpectResumedFromTheNewestCheckpoint(log, victim_last);
  // Every step's loss and the final weights are the uninterrupted run's, bit for bit.
  ExpectSameAsBaseline(up.run(), baseline, log);
  ExpectRecorded(up, 1, "rank " + std::to_string(d.rank) + " stalled");
}

TEST(Recovery, MaxRestartsExhausted) {
  const Draw d = DrawFault("MaxRestartsExhausted", 3, 5);
  const ScopedTempDir scratch("recovery-exhausted");
  const std::string dir = scratch.path();
  Up up(dir, RecoverySpec(), {"--max-restarts", "1"});
  const int first = up.WorkerPid(d.rank, 0);
  ASSERT_GT(first, 0) << up.log();
  ASSERT_TRUE(up.WaitForStep(d.step)) << up.log();
  ASSERT_EQ(kill(first, SIGKILL), 0);
  // The one recovery allowed: the rank runs again (its restart line), then dies again.
  const int second = up.WorkerPid(d.rank, 1);
  ASSERT_GT(second, 0) << up.log();
  ASSERT_EQ(kill(second, SIGKILL), 0);
  const int code = up.Wait();
  const std::string log = up.log();
  EXPECT_EQ(code, 10) << "expected exit 10 (job failed)\n" << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("latchkey: \\S+ failed: ([^\n]*)"))) << log;
  const std::string reason = m[1];
  EXPECT_NE(reason.find("rank " + std::to_string(d.rank)), std::string::npos) << reason;
  EXPECT_NE(reason.find("killed by signal 9"), std::string::npos) << reason;
  EXPECT_TRUE(std::regex_search(log, std::regex("step [0-9]+/12[^\n]* failed\n"))) << log;
}

}  // namespace
}  // namespace latchkey::testing
