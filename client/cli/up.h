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
#include <optional>
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

// The runs `latchkey up` started, so that `logs JOB` and `checkpoints JOB` find a job's run
// folder (run_commands.cc): a JSON object keyed by job id in $XDG_STATE_HOME/latchkey/runs.json
// (default ~/.local/state/latchkey/runs.json), written by rename (mode 0600). The newest 200
// runs are kept. Not thread-safe across processes beyond the rename: the last writer wins.
struct RunRecord {
  std::string job_id;
  std::string run_dir;         // absolute
  std::string checkpoint_dir;  // the spec's latchkey.checkpoint.dir; "" when none
  int world = 0;
};
std::string RunRegistryPath();  // "" when neither XDG_STATE_HOME nor HOME is set
absl::Status RecordRun(const RunRecord& run);
std::optional<RunRecord> FindRun(const std::string& job_id);

// The run folder's lock (RUN/up.lock, flock'ed by the `up` using the folder for as long as it
// runs). AcquireRunLock returns its descriptor (kept open: closed at exit, the lock goes with
// it), or FAILED_PRECONDITION naming the folder and the pid of the live `up` that holds it.
absl::StatusOr<int> AcquireRunLock(const std::string& run_dir);
// Whether a live `up` holds the run folder's lock.
bool RunIsLive(const std::string& run_dir);

// `latchkey up`'s options (its flags).
struct UpOptions {
  std::string spec;     // empty: the built-in job
  std::string run_dir;  // default runs/up-<unix time>
  int workers = 0;      // 0 = the spec's world size; anything else must equal it
  // Tighter than the coordinator's and worker's defaults (common/timeouts.h): every process is on
  // this machine, so a silent or stuck rank is a crash, and the user is watching.
  double liveness_s = 10;
  int collective_timeout_s = 30;
  double max_seconds = 24 * 3600;
  int max_restarts = -1;       // >= 0: replaces the spec's latchkey.max_restarts
  bool tls = false;            // a self-signed CA and certificate (openssl CLI); TLS everywhere
  bool no_file_check = false;  // --no-file-check: the spec's files are not checked first
};

// up's first phase, prepare: what the run is, before anything is started.
struct PreparedRun {
  bool built_in = false;
  std::string spec_text;  // with --max-restarts applied
  std::string base_dir;   // where the spec's relative paths resolve
  int world = 0;
  std::string checkpoint_dir;   // the spec's latchkey.checkpoint.dir, "" when none
  std::string dir;              // the run folder, absolute
  std::string tensorboard_dir;  // latchkey.tensorboard.dir, absolute (default RUN/tensorboard)
  int lock_fd = -1;             // RUN/up.lock, held (AcquireRunLock) until `up` exits
  std::string token;            // this run's admin token (only its hash is on disk, in auth-tokens)
  std::string tls_dir;          // RUN/tls
  std::string tls_ca;           // RUN/tls/ca.pem under --tls, else ""
};

// The spec read and validated (so a bad spec, or a file it names that cannot be read, fails
// before anything is started, naming the field), the run folder made, locked (a folder another
// live `up` holds is refused) and cleaned of the last job's files, the spec kept in it as
// RUN/spec.json (the canonical form: absolute paths, so it can be passed back from anywhere), the
// admin token and the certificates made. Prints the built-in spec's line, and warns when a live
// run recorded in the run registry uses the same checkpoint folder. up_prepare.cc.
absl::StatusOr<PreparedRun> Prepare(const UpOptions& o);

// A CA and a certificate for 127.0.0.1/localhost signed by it, made with the openssl CLI in
// `dir`: ca.pem, ca.key, server.pem, server.key (keys and certificates mode 0600), their
// output in dir/openssl.log. PERMISSION_DENIED when `dir` cannot be made; FAILED_PRECONDITION
// naming the log when a step fails. Call it before any thread starts (it sets the umask).
absl::Status MakeLocalCertificates(const std::string& dir);

// The summary table from rank 0's per-step JSONL (the last record of each step counts: a
// restarted rank appends), with the job's attempt and restarts when `job` is known. A field the
// JSONL holds as null (a loss or gradient norm that was not finite: JSON has no NaN) or not at
// all reads as absent, never as an error; a diverged step is named. UpSummary returns the text
// PrintUpSummary prints to stdout ("" when the JSONL has no step).
std::string UpSummary(const std::string& jsonl, const JobInfo* job, int worker_restarts,
                      int coordinator_restarts);
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
// at once, unless it exited with kRestartMeExitCode); one that exited kExitTrainingDiverged
// (common/worker_protocol.h: its training diverged, the job failed) is not started again; a
// worker the coordinator declared stalled
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
