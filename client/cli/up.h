// The pieces of `latchkey up` (up_command.cc, its phases): its supervisor of the local
// processes (up_supervisor.cc), the certificates of --tls (up_tls.cc) and the summary it ends
// with (up_summary.cc).
#ifndef LATCHKEY_CLIENT_CLI_UP_H_
#define LATCHKEY_CLIENT_CLI_UP_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/cli/cli.h"
#include "common/job_info.h"
#include "common/subprocess.h"

namespace latchkey::cli {

std::string ReadTextFile(const std::string& path);  // "" when unreadable

// A CA and a certificate for 127.0.0.1/localhost signed by it, made with the openssl CLI in
// `dir`: ca.pem, ca.key, server.pem, server.key (keys and certificates mode 0600), their
// output in dir/openssl.log. PERMISSION_DENIED when `dir` cannot be made; FAILED_PRECONDITION
// naming the log when a step fails. Call it before any thread starts (it sets the umask).
absl::Status MakeLocalCertificates(const std::string& dir);

// The summary table from rank 0's per-step JSONL (the last record of each step counts: a
// restarted rank appends), with the job's attempt and restarts when `job` is known.
void PrintUpSummary(const std::string& jsonl, const JobInfo* job, int worker_restarts,
                    int coordinator_restarts);

struct SupervisorConfig {
  ClientOptions client;  // the coordinator (ReportFailure, GetJob)
  std::string job_id;
  std::string join_token;
  std::string run_dir;  // worker-R.port.json files are read here
  int world = 0;
  std::function<SpawnOptions(int rank)> worker;  // how rank R is started (and restarted)
  SpawnOptions coordinator;  // how the coordinator is restarted: the same ports and database
  pid_t coordinator_pid = -1;
  bool live_progress = false;  // stdout shows a live bar: clear it before a line
  std::chrono::seconds first_metrics_wait{60};
};

// Keeps a job's local processes alive while the job is not over: a worker process that exits
// is started again with the same rank and environment (its death reported to the coordinator
// at once, unless it exited with kRestartMeExitCode), a worker the coordinator declared stalled
// is killed (and so restarted), and a dead coordinator is started again on its ports and
// database. Thread-safe; one thread of its own. The processes it starts come from
// SupervisorConfig's SpawnOptions (`latchkey up` gives each a process group of its own and a
// parent-death signal: common/subprocess.h).
class UpSupervisor {
 public:
  // A worker exits with this code when its attempt was fenced while it was stuck: it only asks
  // to be started again, the coordinator knows already.
  static constexpr int kRestartMeExitCode = 75;

  explicit UpSupervisor(SupervisorConfig config);
  ~UpSupervisor();
  UpSupervisor(const UpSupervisor&) = delete;
  UpSupervisor& operator=(const UpSupervisor&) = delete;

  // Starts every rank's worker and the supervising thread; nothing once Stop() was called.
  absl::Status Start();
  // Until every rank's first start has printed its metrics line (or gave up waiting for it).
  void WaitFirstAnnounced();
  // The job as the watch sees it now: its state, attempt and stalled ranks.
  void OnJob(const JobInfo& job);
  // No more restarts; the thread ends. Idempotent.
  void Stop();
  std::vector<pid_t> WorkerPids();
  pid_t CoordinatorPid();
  int worker_restarts();
  int coordinator_restarts();

 private:
  struct Rank {
    pid_t pid = -1;
    int restarts = 0;
    std::chrono::steady_clock::time_point started;
    bool killed_for_stall = false;
    bool announce = false;  // its metrics line is still to be printed
    std::chrono::steady_clock::time_point announce_until;
    bool first_done = false;  // the first start's line was printed, or given up
  };
  struct Death {
    int rank;
    pid_t pid;
    ExitInfo exit;
    bool stall_kill;
    double lived_s;
  };

  void Loop();
  void Say(const std::string& line);
  absl::Status SpawnRank(int r);  // mu_ held
  void Announce();                // mu_ held
  void CheckCoordinator();        // mu_ held
  // Reports the death (or asks the job's state) and says whether to start the rank again.
  bool ShouldRestart(const Death& d);

  SupervisorConfig config_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Rank> ranks_;
  bool stopping_ = false;
  bool terminal_ = false;
  int64_t attempt_ = 1;
  std::set<std::pair<int, int64_t>> stalls_handled_;  // (rank, attempt) verdicts acted on
  pid_t coordinator_pid_ = -1;
  int coordinator_restarts_ = 0;
  std::chrono::steady_clock::time_point coordinator_started_;
  std::mutex join_mu_;
  std::thread thread_;
};

}  // namespace latchkey::cli

#endif  // LATCHKEY_CLIENT_CLI_UP_H_
