// `latchkey up`'s supervisor: restarts dead workers (same rank, same environment) and a dead
// coordinator (same ports, same database), reports each death to the coordinator, and kills the
// workers the coordinator declared stalled (docs/fault-tolerance.md).
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "client/cli/format.h"
#include "client/cli/up.h"
#include "client/failure_report.h"
#include "common/error_info.h"
#include "common/worker_protocol.h"

namespace latchkey::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string DeathMessage(const ExitInfo& e) {
  if (e.signal != 0) return "process exited: killed by signal " + std::to_string(e.signal);
  return "process exited with code " + std::to_string(e.code);
}

}  // namespace

UpSupervisor::UpSupervisor(SupervisorConfig config)
    : config_(std::move(config)),
      ranks_(static_cast<size_t>(config_.world)),
      coordinator_pid_(config_.coordinator_pid),
      coordinator_started_(Clock::now()) {}

UpSupervisor::~UpSupervisor() { Stop(); }

void UpSupervisor::Say(const std::string& line) {
  if (config_.on_line) {
    config_.on_line(line);
    return;
  }
  std::lock_guard<std::mutex> lock(OutputMutex());
  std::printf("%s%s\n", config_.live_progress ? "\r\033[K" : "", line.c_str());
  std::fflush(stdout);
}

absl::Status UpSupervisor::SpawnRank(int r) {
  Rank& rank = ranks_[static_cast<size_t>(r)];
  // A restarted worker writes its port file again once it serves its metrics.
  std::error_code ec;
  fs::remove(config_.run_dir + "/worker-" + std::to_string(Global(r)) + ".port.json", ec);
  SpawnOptions options = config_.worker(Global(r));
  options.append_log = rank.restarts > 0;
  const absl::StatusOr<pid_t> pid = Spawn(options);
  if (!pid.ok()) return pid.status();
  rank.pid = *pid;
  rank.started = Clock::now();
  rank.killed_for_stall = false;
  rank.announce = true;
  rank.announce_until =
      rank.started + (rank.restarts == 0 ? config_.first_metrics_wait : std::chrono::seconds(300));
  return absl::OkStatus();
}

absl::Status UpSupervisor::Start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::OkStatus();  // stopped first (a signal): nothing to start
    for (int r = 0; r < config_.world; ++r) {
      if (absl::Status st = SpawnRank(r); !st.ok()) return st;
    }
  }
  // A Stop() meanwhile finds no thread to join; this one then ends at once, and the
  // destructor's Stop() joins it.
  std::lock_guard<std::mutex> lock(join_mu_);
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void UpSupervisor::Announce() {
  for (int r = 0; r < config_.world; ++r) {
    Rank& rank = ranks_[static_cast<size_t>(r)];
    if (!rank.announce) continue;
    // The first start's lines come in rank order.
    if (rank.restarts == 0 && r > 0 && !ranks_[static_cast<size_t>(r - 1)].first_done) break;
    const std::string port_file =
        config_.run_dir + "/worker-" + std::to_string(Global(r)) + ".port.json";
    const nlohmann::json info =
        nlohmann::json::parse(ReadTextFile(port_file), nullptr, /*allow_exceptions=*/false);
    const bool ready = info.is_object() && info.value("metrics_port", -1) > 0;
    if (ready) {
      const std::string where = rank.restarts == 0
                                    ? absl::StrCat("(log ", config_.worker(Global(r)).log_path, ")")
                                    : absl::StrCat("(restart ", rank.restarts, ")");
      Say(absl::StrCat("worker ", Global(r), "     pid ", rank.pid, "  metrics http://",
                       info.value("metrics_host", std::string("127.0.0.1")), ":",
                       info.value("metrics_port", -1), "/metrics  ", where));
    }
    if (ready || Clock::now() >= rank.announce_until) {
      rank.announce = false;
      rank.first_done = true;
      cv_.notify_all();
    }
  }
}

void UpSupervisor::WaitFirstAnnounced() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    if (stopping_ || terminal_) return true;
    for (const Rank& r : ranks_) {
      if (!r.first_done) return false;
    }
    return true;
  });
}

void UpSupervisor::CheckCoordinator() {
  if (coordinator_pid_ <= 0) return;
  const std::optional<ExitInfo> exit = PollExit(coordinator_pid_);
  if (!exit) return;
  const pid_t old = coordinator_pid_;
  coordinator_pid_ = -1;
  if (terminal_ || stopping_) return;
  Say(absl::StrCat("coordinator  pid ", old, "  ", DescribeExit(*exit),
                   "; starting it again on the same ports and database"));
  if (SecondsSince(coordinator_started_) < 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // e.g. its port not yet free
  }
  SpawnOptions options = config_.coordinator;
  options.append_log = true;
  const absl::StatusOr<pid_t> pid = Spawn(options);
  if (!pid.ok()) {
    Say("coordinator  cannot be started again: " + std::string(pid.status().message()));
    return;
  }
  coordinator_pid_ = *pid;
  coordinator_started_ = Clock::now();
  ++coordinator_restarts_;
  Say(absl::StrCat("coordinator  ", config_.client.coordinator, "  pid ", *pid, "  (restart ",
                   coordinator_restarts_, ")"));
}

bool UpSupervisor::ShouldRestart(const Death& d) {
  if (d.exit.signal == 0 && d.exit.code == 0) return false;  // it finished its job
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (terminal_ || stopping_) return false;  // it left because the job ended
  }
  ClientOptions client = config_.client;
  client.timeout = absl::Seconds(3);
  // The training diverged: the worker reported it and the job failed; a restart would diverge
  // the same way. The report below is for a job that has not heard of it (the worker's own
  // report lost): it fails the job the same way, and changes nothing on an ended one.
  const bool diverged = d.exit.signal == 0 && d.exit.code == kExitTrainingDiverged;
  // A stalled rank's verdict, a fenced worker's own exit and a preempted worker's leave are
  // known to the coordinator.
  const bool report =
      !d.stall_kill &&
      !(d.exit.signal == 0 && (d.exit.code == kRestartMeExitCode || d.exit.code == kExitPreempted));
  if (report) {
    WorkerFailure f;
    f.job_id = config_.job_id;
    f.join_token = config_.join_token;
    f.worker_id = WorkerIdOf(d.pid);
    f.rank = Global(d.rank);
    f.message = DeathMessage(d.exit);
    if (diverged) {
      f.message += " (training diverged)";
      f.permanent = true;
      f.reason = error_reason::kTrainingDiverged;
    }
    const absl::StatusOr<WorkerFailureResult> r = ReportWorkerFailure(client, f);
    if (diverged) return false;
    if (r.ok()) return !IsTerminal(r->state);
    if (r.status().code() == absl::StatusCode::kFailedPrecondition) return false;  // job over
  }
  JobClient jobs(client);
  const absl::StatusOr<JobInfo> job = jobs.GetJob(config_.job_id);
  if (job.ok()) return !IsTerminal(job->state);
  std::lock_guard<std::mutex> lock(mu_);
  return !terminal_;
}

void UpSupervisor::Loop() {
  while (true) {
    std::vector<Death> deaths;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stopping_; });
      if (stopping_) return;
      CheckCoordinator();
      for (int r = 0; r < config_.world; ++r) {
        Rank& rank = ranks_[static_cast<size_t>(r)];
        if (rank.pid <= 0) continue;
        const std::optional<ExitInfo> exit = PollExit(rank.pid);
        if (!exit) continue;
        deaths.push_back({r, rank.pid, *exit, rank.killed_for_stall, SecondsSince(rank.started)});
        rank.pid = -1;
        rank.last_exit = *exit;
        if (rank.announce) {
          rank.announce = false;
          rank.first_done = true;
          cv_.notify_all();
        }
      }
      Announce();
    }
    for (const Death& d : deaths) {
      if (d.exit.signal != 0 || d.exit.code != 0) {
        Say(absl::StrCat("worker ", Global(d.rank), "     pid ", d.pid, "  ",
                         DescribeExit(d.exit)));
      }
      // The coordinator's calls run without the lock: the watch keeps going meanwhile.
      const bool restart = ShouldRestart(d);
      if (d.lived_s < 1.0) std::this_thread::sleep_for(std::chrono::seconds(1));  // no busy loop
      std::lock_guard<std::mutex> lock(mu_);
      Rank& rank = ranks_[static_cast<size_t>(d.rank)];
      if (!restart || stopping_ || terminal_) {
        rank.ended = true;
        cv_.notify_all();
        continue;
      }
      ++rank.restarts;
      if (absl::Status st = SpawnRank(d.rank); !st.ok()) {
        Say(absl::StrCat("worker ", Global(d.rank),
                         "     cannot be started again: ", st.message()));
        rank.ended = true;
        cv_.notify_all();
      }
    }
  }
}

void UpSupervisor::OnJob(const JobInfo& job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (IsTerminal(job.state)) {
    terminal_ = true;
    cv_.notify_all();
  }
  if (job.attempt > attempt_) {
    attempt_ = job.attempt;
    Say(absl::StrCat("recovery     attempt ", job.attempt, " (restart ", job.restarts, " of ",
                     job.max_restarts, ")",
                     job.resume_step >= 0
                         ? absl::StrCat(" from the checkpoint after step ", job.resume_step)
                         : std::string(" from the start"),
                     job.last_recovery_reason.empty() ? "" : ": " + job.last_recovery_reason));
  }
  for (const StalledRank& s : job.stalled) {
    const int index = s.rank - config_.first_rank;
    if (index < 0 || index >= config_.world) continue;
    if (!stalls_handled_.insert({s.rank, s.attempt}).second) continue;
    Rank& rank = ranks_[static_cast<size_t>(index)];
    // Only the process that was there when the rank stalled: a replacement started since is not.
    if (rank.pid <= 0 || SecondsSince(rank.started) < s.seconds) continue;
    Say(absl::StrCat("worker ", s.rank, "     pid ", rank.pid, "  stalled: ", StalledLine(s),
                     "; killing it"));
    rank.killed_for_stall = true;
    kill(rank.pid, SIGKILL);
  }
}

void UpSupervisor::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  std::lock_guard<std::mutex> lock(join_mu_);  // Ctrl-C's thread and the main thread
  if (thread_.joinable()) thread_.join();
}

bool UpSupervisor::AwaitAllEnded() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto all_ended = [&] {
    for (const Rank& r : ranks_) {
      if (!r.ended) return false;
    }
    return true;
  };
  cv_.wait(lock, [&] { return stopping_ || all_ended(); });
  return all_ended();
}

std::vector<std::optional<ExitInfo>> UpSupervisor::LastExits() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::optional<ExitInfo>> out;
  for (const Rank& r : ranks_) {
    out.push_back(r.pid > 0 ? std::nullopt : r.last_exit);
  }
  return out;
}

std::vector<pid_t> UpSupervisor::WorkerPids() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<pid_t> pids;
  for (const Rank& r : ranks_) {
    if (r.pid > 0) pids.push_back(r.pid);
  }
  return pids;
}

pid_t UpSupervisor::CoordinatorPid() {
  std::lock_guard<std::mutex> lock(mu_);
  return coordinator_pid_;
}

int UpSupervisor::worker_restarts() {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const Rank& r : ranks_) n += r.restarts;
  return n;
}

int UpSupervisor::coordinator_restarts() {
  std::lock_guard<std::mutex> lock(mu_);
  return coordinator_restarts_;
}

}  // namespace latchkey::cli
