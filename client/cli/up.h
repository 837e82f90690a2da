// The pieces of `latchkey up` (up_command.cc, its phases): its supervisor of the local
// processes (up_supervisor.cc), the certificates of --tls (up_tls.cc) and the summary it ends
// with (up_summary.cc).
#ifndef LATCHKEY_CLIENT_CLI_UP_H_
#define LATCHKEY_CLIENT_CLI_UP_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
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

// The path of one of latchkey's binaries: next to this executable, else in the build tree's
// `subdir` beside its folder, else `name` (looked up on PATH when started). up_command.cc.
std::string FindBinary(const std::string& name, const std::string& subdir);

// The runs `latchkey up` started, so that `logs JOB` and `checkpoints JOB` find a job's run
// folder (run_commands.cc): $XDG_STATE_HOME/latchkey/runs.json (default
// ~/.local/state/latchkey/runs.json), {"version": 2, "runs": [record, ...]}, one record per
// (coordinator address, job id): each coordinator numbers its jobs from job-000001, so a job id
// alone names a job only together with its coordinator. Entries of the first format (an object
// keyed by job id, no address) are read as records with an empty coordinator and kept. Written
// by rename (mode 0600); the newest 200 runs are kept. Not thread-safe across processes beyond
// the rename: the last writer wins. run_registry.cc.
struct RunRecord {
  std::string job_id;
  std::string run_dir;         // absolute
  std::string checkpoint_dir;  // the spec's latchkey.checkpoint.dir; "" when none
  int world = 0;
  std::string coordinator;  // the address of the coordinator `up` ran it on; "" when not known
  int64_t recorded_unix_seconds = 0;  // when `up` recorded it (RecordRun sets it)
  // The job's uid (common/job_uid.h): `checkpoints JOB` lists the checkpoints that carry it.
  // "" when unknown (a record written before job uids).
  std::string job_uid;
};
std::string RunRegistryPath();  // "" when neither XDG_STATE_HOME nor HOME is set
// Every record, newest first; none when the file is missing or unreadable.
std::vector<RunRecord> ReadRuns();
// Adds `run`, replacing the record of the same (coordinator, job id) and any record of the same
// job id in the same run folder (a database that was removed numbered its jobs again).
absl::Status RecordRun(const RunRecord& run);
// The address as recorded and compared: "localhost" spelled 127.0.0.1.
std::string CanonicalAddress(const std::string& address);

// Which run of `job_id` a command means: the one in `run_dir` when given (its record, else what
// the folder holds: RUN/jobs/JOB/spec.json), else the record at `coordinator` when given (the
// explicit --coordinator or $LATCHKEY_COORDINATOR), else the one record of that job id whose run
// folder still exists. NOT_FOUND naming the job, the coordinator and the registry when none;
// INVALID_ARGUMENT listing the candidates (address, run folder, when) when several runs have
// that id and nothing says which.
absl::StatusOr<RunRecord> ResolveRun(const std::string& job_id, const std::string& coordinator,
                                     const std::string& run_dir);

// A run folder keeps each job's records apart, in RUN/jobs/JOB/: worker-R.log, steps-R.jsonl
// and spec.json (the spec as submitted). RUN/worker-R.log and RUN/steps-R.jsonl are relative
// symbolic links to the newest job's files, replaced when a job starts (run_folder.cc).
std::string JobRecordsDir(const std::string& run_dir, const std::string& job_id);
// A run folder as it is recorded and compared: absolute, normalized, no trailing slash.
std::string AbsoluteFolder(const std::string& path);
// Before a job is submitted in the folder: removes the top-level links of the job before (its
// files stay in RUN/jobs/), and moves the records a run folder of the older layout kept at the
// top level (plain files) into RUN/jobs/<the newest job recorded for the folder>/, or
// RUN/jobs/earlier-<unix time>/ when no record names one.
void SetAsidePreviousRecords(const std::string& run_dir);
// Once the job has its id: makes RUN/jobs/JOB (a folder of that name left by a database that
// was removed is moved aside to JOB.earlier-<unix time>), copies RUN/spec.json into it, and
// points RUN/worker-R.log and RUN/steps-R.jsonl for R < world at it. PERMISSION_DENIED naming
// the path that cannot be made.
absl::Status StartJobRecords(const std::string& run_dir, const std::string& job_id, int world);
// Where the records of `run`'s job are: RUN/jobs/JOB, or RUN itself for a job a run folder of
// the older layout holds (plain files at the top level, and the registry's newest job in that
// folder). NOT_FOUND naming the job and the folders looked in.
absl::StatusOr<std::string> FindJobRecords(const RunRecord& run);

// What to say when the coordinator asked about `job_id` does not answer (`unreachable`, an
// UNAVAILABLE): where the registry says the job ran. A run whose `up` has ended (RunIsLive
// false) took its coordinator with it: FAILED_PRECONDITION naming the run folder, that its `up`
// ended, and where its records are (`latchkey logs`, `latchkey checkpoints`, RUN/coordinator.db);
// a live run elsewhere: `unreachable` with the address to pass. `coordinator` is the explicit
// address ("" when none was given: every run of that id counts). `unreachable` itself when the
// registry knows no run of the job.
absl::Status ExplainUnreachableJob(const std::string& job_id, const std::string& coordinator,
                                   const absl::Status& unreachable);

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
// live `up` holds is refused), the last job's records set aside (SetAsidePreviousRecords: they
// stay in RUN/jobs/JOB, its port files go), the spec kept in it as
// RUN/spec.json (the canonical form: absolute paths, so it can be passed back from anywhere), the
// admin token and the certificates made. Prints the built-in spec's line, warns when a live run
// recorded in the run registry uses the same checkpoint folder, and when that folder holds
// committed checkpoints of other jobs (OtherJobsCheckpointsWarning). up_prepare.cc.
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
  // The ranks it keeps: first_rank .. first_rank + world - 1 (`up`: every rank of the job;
  // `latchkey node`: its node's).
  int world = 0;
  int first_rank = 0;
  std::function<SpawnOptions(int rank)> worker;  // how rank R is started (and restarted)
  SpawnOptions coordinator;  // how the coordinator is restarted: the same ports and database
  pid_t coordinator_pid = -1;
  bool live_progress = false;  // stdout shows a live bar: clear it before a line
  // Where its lines go instead of stdout (`latchkey node`: stdout and its log); null: stdout.
  std::function<void(const std::string&)> on_line;
  std::chrono::seconds first_metrics_wait{60};
};

// Keeps a job's local processes alive while the job is not over: a worker process that exits
// is started again with the same rank and environment (its death reported to the coordinator
// at once, unless it exited with kRestartMeExitCode or kExitPreempted: the coordinator knows of
// those already); one that exited kExitTrainingDiverged
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
  // No more restarts; the thread ends. Idempotent. The processes still running keep running.
  void Stop();
  // Until every process has ended for good (exited, and not to be started again: the job is
  // over or its exit says so), or Stop(). True when they all ended.
  bool AwaitAllEnded();
  // Each process's last exit, by local index (none: it runs now, or never ran).
  std::vector<std::optional<ExitInfo>> LastExits();
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
    std::optional<ExitInfo> last_exit;
    bool ended = false;  // exited and not to be started again
  };
  struct Death {
    int rank;
    pid_t pid;
    ExitInfo exit;
    bool stall_kill;
    double lived_s;
  };

  void Loop();
  int Global(int index) const { return config_.first_rank + index; }  // the rank it runs
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
