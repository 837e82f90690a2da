// `latchkey up`: the local launcher. Starts an embedded coordinator (its SQLite file in the run
// folder), submits the job, starts one latchkey-worker process per rank on this machine (Gloo on
// CPU), shows live progress, prints where the metrics endpoints are, and ends with a summary
// table from the ranks' per-step JSONL. Ctrl-C (SIGINT, SIGTERM, SIGHUP) cancels the job and
// stops everything it started; whatever ends `up`, kill -9 included, ends its children and leaves
// the job cancelled in the database (Supervise, below).
// While the job runs, a supervisor (up_supervisor.cc) starts a dead worker again with the same
// rank and reports its death, kills a worker the coordinator declared stalled, and starts a dead
// coordinator again on the same ports and database; the job recovers from its last checkpoint
// up to latchkey.max_restarts (--max-restarts) times, then fails naming the cause, and `up`
// exits non-zero.
// Auth is on, as on any coordinator: `up` makes an admin token (32 random bytes, hex), starts its
// coordinator with --auth-tokens <run>/auth-tokens (the token's SHA-256 only), keeps the token in
// <run>/credentials.json and in the user's credentials file under the coordinator's address
// (client/credentials.h; all mode 0600), so `latchkey --coordinator ADDR status JOB` works
// against it. Workers get their join token in the environment, never on the command line.
// Without --spec it runs the built-in job (builtin_spec.h), which reads no files. Either way the
// spec is kept as <run>/spec.json, to edit and pass back with --spec; the run folder is locked
// against a second live `up` (<run>/up.lock), the job recorded in the run registry for `latchkey
// logs` and `latchkey checkpoints` (up.h), and the credentials entry removed when `up` ends.
// RunUp is five phases, each a function with the struct it returns: Prepare (run folder,
// spec, token, --tls certificates: up_prepare.cc, up_tls.cc), StartCoordinator (started, its port
// file read, credentials kept), Submit, Supervise (workers, restarts, progress, Ctrl-C) and Finish
// (the summary and the exit code). The coordinator and the workers are this process's children,
// each in a process group of its own (a terminal's Ctrl-C reaches `up` alone, which stops them in
// order) and with SIGTERM as its parent-death signal (common/subprocess.h).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "client/cli/cli.h"
#include "client/cli/up.h"
#include "client/credentials.h"
#include "common/cli_checks.h"
#include "common/job_spec.h"
#include "common/subprocess.h"

namespace latchkey::cli {

// The build tree puts the binaries at build/{client,server,worker}/; an install puts them on
// PATH. Prefer siblings of this executable's folder, then PATH.
std::string FindBinary(const std::string& name, const std::string& subdir) {
  namespace fs = std::filesystem;
  const fs::path self = fs::read_symlink("/proc/self/exe");
  for (const fs::path& p :
       {self.parent_path() / name, self.parent_path().parent_path() / subdir / name}) {
    if (fs::exists(p)) return p.string();
  }
  return name;  // PATH lookup by posix_spawnp
}

namespace {

namespace fs = std::filesystem;

int FreeLocalPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;  // 0: let the coordinator choose
}

// --- The phases, modelled on an elastic agent's (initialize the workers, then monitor them):
// prepare -> coordinator -> submit -> supervise -> finish. Each takes what the ones before it
// made and returns what it made; a phase that fails has stopped what it started itself.

// How every child of `up` is started: in its own process group, so a terminal's Ctrl-C or
// hang-up reaches `up` alone (it cancels the job, then stops them), and with SIGTERM when `up`
// ends without stopping them (kill -9): the coordinator then cancels the job, a worker unlinks
// its shm rendezvous name.
void AsChildOfUp(SpawnOptions& options) {
  options.own_process_group = true;
  options.parent_death_signal = SIGTERM;
}

// The coordinator's command line: on `listen` and `metrics_port` (its first start: any free
// ones; a restart: the ones it had), its database, tokens and port file in the run folder.
// --cancel-on-shutdown: a stop signal cancels the job before it stops (its jobs end with it).
SpawnOptions CoordinatorCommand(const UpOptions& o, const PreparedRun& run,
                                const std::string& listen, const std::string& metrics_port) {
  SpawnOptions coordinator;
  coordinator.args = {FindBinary("latchkey-coordinator", "server"), "--listen", listen, "--db",
                      run.dir + "/coordinator.db", "--metrics-host", "127.0.0.1", "--metrics-port",
                      metrics_port, "--port-file", run.dir + "/ports.json", "--auth-tokens",
                      run.dir + "/auth-tokens", "--liveness-timeout", std::to_string(o.liveness_s),
                      // Positions (and stall verdicts) every second.
                      "--heartbeat-interval", "1", "--cancel-on-shutdown",
                      // Its callers are this run's processes, stopping with it: a second for
                      // their calls in flight when it stops (not the default 5 s).
                      "--shutdown-grace", "1"};
  if (o.tls) {
    coordinator.args.insert(coordinator.args.end(), {"--tls-cert", run.tls_dir + "/server.pem",
                                                     "--tls-key", run.tls_dir + "/server.key"});
  }
  coordinator.log_path = run.dir + "/coordinator.log";
  AsChildOfUp(coordinator);
  return coordinator;
}

// coordinator: the process up started, where it serves, and how to start it again.
struct RunningCoordinator {
  pid_t pid = -1;
  CliContext ctx;  // the user's context pointed at this coordinator, with this run's token
  int metrics_port = 0;
  SpawnOptions restart;  // the same ports and database
};

// Starts the coordinator and waits for its port file (up to 10 s), then keeps the run's
// credentials (RUN/credentials.json, and the user's credentials file: a warning if that fails).
// Prints the coordinator's and the auth lines. On failure the coordinator is stopped.
absl::StatusOr<RunningCoordinator> StartCoordinator(const CliContext& user_ctx, const UpOptions& o,
                                                    const PreparedRun& run) {
  const absl::StatusOr<pid_t> started = Spawn(CoordinatorCommand(o, run, "127.0.0.1:0", "0"));
  if (!started.ok()) return started.status();
  RunningCoordinator c;
  c.pid = *started;
  nlohmann::json ports;
  for (int i = 0; i < 200 && ports.is_null(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto parsed =
        nlohmann::json::parse(ReadTextFile(run.dir + "/ports.json"), nullptr, false);
    if (!parsed.is_discarded() && parsed.contains("grpc_port")) ports = parsed;
  }
  if (ports.is_null()) {
    StopAll({c.pid}, std::chrono::seconds(2));
    return absl::UnavailableError("coordinator did not start; see " + run.dir + "/coordinator.log");
  }
  c.metrics_port = ports.value("metrics_port", 0);
  c.ctx = user_ctx;
  c.ctx.coordinator = "127.0.0.1:" + std::to_string(ports["grpc_port"].get<int>());
  // Its own coordinator, plaintext on loopback, with the token made above (not the user's).
  c.ctx.credentials = ChannelCredentials{};
  c.ctx.credentials.token = run.token;
  c.ctx.credentials.tls_ca = run.tls_ca;
  nlohmann::json entry = {{c.ctx.coordinator, {{"token", run.token}}}};
  if (o.tls) entry[c.ctx.coordinator]["tls_ca"] = run.tls_ca;
  if (absl::Status st = WritePrivateFile(run.dir + "/credentials.json", entry.dump(2) + "\n");
      !st.ok()) {
    StopAll({c.pid}, std::chrono::seconds(2));
    return st;
  }
  const std::string user_file =
      c.ctx.credentials_file.empty() ? DefaultCredentialsPath() : c.ctx.credentials_file;
  if (absl::Status st = SaveCredentials(user_file, c.ctx.coordinator, {run.token, run.tls_ca});
      !st.ok()) {
    std::fprintf(stderr, "latchkey up: warning: %s (the token is in %s/credentials.json)\n",
                 std::string(st.message()).c_str(), run.dir.c_str());
  }
  // The watch waits out a restart of the coordinator.
  c.ctx.watch_reconnect_s = 60;
  // Started again on the ports it had, so workers and the watch find it where it was.
  c.restart = CoordinatorCommand(o, run, c.ctx.coordinator, std::to_string(c.metrics_port));
  // Under --tls the coordinator's HTTP port serves HTTPS with the same certificate.
  std::printf(
      "coordinator  %s  (metrics %s://127.0.0.1:%d/metrics, db %s/coordinator.db, pid %d)\n",
      c.ctx.coordinator.c_str(), o.tls ? "https" : "http", c.metrics_port, run.dir.c_str(),
      static_cast<int>(c.pid));
  std::printf("auth         admin token in %s/credentials.json (and the credentials file)\n",
              run.dir.c_str());
  return c;
}

// submit: the job at the coordinator.
struct SubmittedJob {
  std::string id;
  std::string join_token;
  std::string uid;  // the job's uid (common/job_uid.h): recorded with the run
};

// Submits the spec with a rendezvous on this machine and prints the job line. On failure the
// coordinator is stopped.
absl::StatusOr<SubmittedJob> Submit(const PreparedRun& run, const RunningCoordinator& c) {
  JobClient client(c.ctx.client_options());
  JobSubmission submission;
  submission.spec_json = run.spec_text;
  submission.base_dir = run.base_dir;
  submission.rendezvous_host = "127.0.0.1";
  // A port free right now on this machine, rather than the coordinator's range, which other
  // local coordinators (other `up` runs) hand out too.
  submission.rendezvous_port = FreeLocalPort();
  auto submitted = client.SubmitJob(submission);
  if (!submitted.ok()) {
    StopAll({c.pid}, std::chrono::seconds(2));
    return submitted.status();
  }
  std::printf("job          %s  (%d workers, run folder %s)\n", submitted->job_id.c_str(),
              run.world, run.dir.c_str());
  std::fflush(stdout);
  return SubmittedJob{submitted->job_id, submitted->join_token, submitted->job.job_uid};
}

// Rank r's worker command line and environment (the same for every restart of it).
SpawnOptions WorkerCommand(const UpOptions& o, const PreparedRun& run, const std::string& address,
                           const SubmittedJob& job, int r) {
  SpawnOptions worker;
  // The job's records in RUN/jobs/JOB (RUN/steps-R.jsonl and RUN/worker-R.log link to them).
  const std::string records = JobRecordsDir(run.dir, job.id);
  worker.args = {FindBinary("latchkey-worker", "worker"), "--coordinator", address, "--job", job.id,
                 "--metrics-host", "127.0.0.1", "--metrics-port", "0", "--metrics-jsonl",
                 records + "/steps-{rank}.jsonl", "--trace-jsonl", records + "/trace-{rank}.jsonl",
                 "--port-file", run.dir + "/worker-{rank}.port.json", "--save", run.dir + "/final",
                 "--collective-timeout-seconds", std::to_string(o.collective_timeout_s), "--quiet",
                 // Each rank's log (`latchkey logs`) gets its per-step lines.
                 "--log-steps"};
  // The join token in the environment (not visible in `ps`); this coordinator's CA (or
  // plaintext), whatever TLS settings the user's environment holds.
  // LOCAL_RANK: every rank runs on this machine (latchkey.device "cuda" uses cuda:LOCAL_RANK).
  worker.extra_env = {"RANK=" + std::to_string(r),
                      "LOCAL_RANK=" + std::to_string(r),
                      "LOCAL_WORLD_SIZE=" + std::to_string(run.world),
                      "LATCHKEY_JOIN_TOKEN=" + job.join_token,
                      "LATCHKEY_TLS_CA=" + run.tls_ca,
                      "LATCHKEY_TLS_CERT=",
                      "LATCHKEY_TLS_KEY="};
  worker.log_path = records + "/worker-" + std::to_string(r) + ".log";
  AsChildOfUp(worker);
  return worker;
}

// supervise: how the job ended, and what it took.
struct Supervised {
  int code = kOk;  // WatchUntilEnd's exit code; after a stop signal, the job's final state's
  bool have_job = false;
  JobInfo last_job;
  int worker_restarts = 0;
  int coordinator_restarts = 0;
};

std::string SignalName(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "signal " + std::to_string(sig);
  }
}

// Cancels the job, trying again for 4 s while the coordinator does not answer (the supervisor
// may be starting it again: that takes a second or two). OK once the job is final (cancelled
// now, or it had ended). Calls of 2 s: a coordinator that accepts and never answers (stopped,
// hung) costs no more than one that refuses.
absl::Status CancelUntilFinal(const RunningCoordinator& c, const std::string& job_id,
                              const std::string& reason) {
  ClientOptions options = c.ctx.client_options();
  options.timeout = absl::Seconds(2);
  JobClient client(options);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  while (true) {
    const absl::StatusOr<JobInfo> cancelled = client.CancelJob(job_id, reason);
    if (cancelled.ok() || absl::IsFailedPrecondition(cancelled.status())) return absl::OkStatus();
    const bool retry =
        absl::IsUnavailable(cancelled.status()) || absl::IsDeadlineExceeded(cancelled.status());
    if (!retry || std::chrono::steady_clock::now() >= until) return cancelled.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// The exit code for a job `up` stopped: its final state's (it may have ended on its own first).
int CodeAfterStop(const Supervised& s) {
  if (!s.have_job) return kJobCancelled;
  switch (s.last_job.state) {
    case JobState::kSucceeded:
      return kOk;
    case JobState::kFailed:
      return kJobFailed;
    default:
      return kJobCancelled;
  }
}

// Starts every rank's worker under the supervisor, watches the job to its end, then stops the
// workers (they leave on their own once the job ended) and the coordinator.
// Stop signals (`sigs`: SIGINT, SIGTERM, SIGHUP) go to a thread of their own. The first cancels
// the job at the coordinator, which records it (the job is final whatever happens next), and
// ends the restarts; the watch then sees the job cancelled, and the workers and the coordinator
// are stopped as at any end, with less patience. A second signal stops them at once (SIGTERM:
// they still clean up). A coordinator that does not answer for 4 s is given up on: everything
// is stopped and `up` exits 11 at once (the coordinator's --cancel-on-shutdown records the
// cancellation if it still lives), after `forget_credentials` (the user's credentials entry of
// this coordinator goes on every way `up` ends, this one too).
// Fails only when the workers could not be started (the job is cancelled, everything stopped).
absl::StatusOr<Supervised> Supervise(const UpOptions& o, const PreparedRun& run,
                                     const RunningCoordinator& c, const SubmittedJob& job,
                                     sigset_t sigs,
                                     const std::function<void()>& forget_credentials) {
  JobClient client(c.ctx.client_options());
  SupervisorConfig sc;
  sc.client = c.ctx.client_options();
  sc.job_id = job.id;
  sc.join_token = job.join_token;
  sc.run_dir = run.dir;
  sc.world = run.world;
  sc.live_progress = LiveProgress(c.ctx);
  sc.coordinator_pid = c.pid;
  sc.coordinator = c.restart;
  sc.worker = [o, run, address = c.ctx.coordinator, job](int r) {
    return WorkerCommand(o, run, address, job, r);
  };
  UpSupervisor supervisor(sc);
  std::atomic<bool> interrupted{false};
  std::atomic<bool> hurry{false};
  // Before the workers start: a signal that came during the earlier phases (blocked, so it
  // waited) cancels the job before any worker exists.
  std::thread signals([&] {
    for (bool first = true;; first = false) {
      int sig = 0;
      sigwait(&sigs, &sig);
      if (sig == SIGUSR1) return;  // `up` is done
      if (!first) {
        hurry = true;
        std::fprintf(stderr, "latchkey up: %s again: stopping everything now\n",
                     SignalName(sig).c_str());
        continue;
      }
      interrupted = true;
      std::fprintf(stderr,
                   "\nlatchkey up: %s: cancelling job %s (a second signal stops everything "
                   "at once)\n",
                   SignalName(sig).c_str(), job.id.c_str());
      const absl::Status cancelled =
          CancelUntilFinal(c, job.id, "interrupted by latchkey up (" + SignalName(sig) + ")");
      supervisor.Stop();  // no more restarts; WaitFirstAnnounced returns
      if (cancelled.ok()) continue;
      // The watch would wait a minute for a coordinator that is not coming back.
      std::fprintf(stderr, "latchkey up: cannot cancel job %s: %s; stopping everything\n",
                   job.id.c_str(), std::string(cancelled.message()).c_str());
      StopAll(supervisor.WorkerPids(), std::chrono::seconds(3));
      StopAll({supervisor.CoordinatorPid()}, std::chrono::seconds(5));
      // _Exit skips RunUp's own cleanup: the entry of the coordinator just stopped goes here.
      forget_credentials();
      std::fflush(stdout);
      std::_Exit(kJobCancelled);
    }
  });
  auto end_signal_thread = [&] {
    pthread_kill(signals.native_handle(), SIGUSR1);
    signals.join();
  };
  if (absl::Status st = supervisor.Start(); !st.ok()) {
    (void)client.CancelJob(job.id, "latchkey up could not start its workers");
    supervisor.Stop();
    StopAll(supervisor.WorkerPids(), std::chrono::seconds(5));
    StopAll({supervisor.CoordinatorPid()}, std::chrono::seconds(5));
    end_signal_thread();
    return st;
  }
  // Where the metrics are: each worker writes its port file once it has formed its groups and
  // serves its metrics (up to a minute: the ranks meet and build their model first).
  supervisor.WaitFirstAnnounced();
  Supervised out;
  WatchHooks hooks;
  hooks.replay_recent_steps = true;  // its own job, from the start: every step it still holds
  hooks.on_job = [&](const JobInfo& j) {
    out.have_job = true;
    supervisor.OnJob(j);
  };
  hooks.last_job = &out.last_job;
  out.code = WatchUntilEnd(c.ctx, job.id, o.max_seconds, hooks);
  if (!out.have_job || !IsTerminal(out.last_job.state)) {
    if (auto j = client.GetJob(job.id); j.ok()) {
      out.last_job = *j;
      out.have_job = true;
    }
  }
  if (interrupted) out.code = CodeAfterStop(out);
  // Workers leave on their own once the job ended; then the coordinator goes.
  supervisor.Stop();
  const std::chrono::seconds patience(interrupted ? 3 : o.collective_timeout_s + 5);
  StopAll(supervisor.WorkerPids(), std::chrono::seconds(5), patience, &hurry);
  StopAll({supervisor.CoordinatorPid()}, std::chrono::seconds(10));
  end_signal_thread();
  out.worker_restarts = supervisor.worker_restarts();
  out.coordinator_restarts = supervisor.coordinator_restarts();
  return out;
}

// finish: the summary, where the weights are (or where the logs are), and the exit code.
int Finish(const PreparedRun& run, const SubmittedJob& job, const Supervised& s) {
  PrintUpSummary(JobRecordsDir(run.dir, job.id) + "/steps-0.jsonl",
                 s.have_job ? &s.last_job : nullptr, s.worker_restarts, s.coordinator_restarts);
  if (!run.tensorboard_dir.empty()) {
    std::printf("tensorboard  tensorboard --logdir %s\n", run.tensorboard_dir.c_str());
  }
  if (s.code == kOk) {
    std::printf("weights      %s/final (HF GPTBigCode checkpoint)\n", run.dir.c_str());
  } else {
    std::fprintf(stderr, "latchkey up: job %s did not succeed (exit %d); logs in %s\n",
                 job.id.c_str(), s.code, JobRecordsDir(run.dir, job.id).c_str());
  }
  return s.code;
}

int RunUp(const CliContext& ctx, const UpOptions& o) {
  // Signals go to one thread (sigwait, in supervise) so Ctrl-C can stop the children from
  // anywhere; blocked from the start, so one that comes early waits for that thread. SIGHUP (a
  // closed terminal) stops the run as Ctrl-C does, unless the user had it ignored (nohup).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  struct sigaction hup {};
  if (sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN) sigaddset(&sigs, SIGHUP);
  sigaddset(&sigs, SIGUSR1);  // our own wake-up of the signal thread at the end
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  const absl::StatusOr<PreparedRun> run = Prepare(o);
  if (!run.ok()) return Fail(run.status());
  const absl::StatusOr<RunningCoordinator> coordinator = StartCoordinator(ctx, o, *run);
  if (!coordinator.ok()) return Fail(coordinator.status());
  // The coordinator `up` started is gone once `up` ends: so is its entry in the user's
  // credentials file (only while it still holds this run's token).
  const std::function<void()> forget_credentials = [&] {
    const std::string& file = coordinator->ctx.credentials_file;
    (void)RemoveCredentials(file.empty() ? DefaultCredentialsPath() : file,
                            coordinator->ctx.coordinator, run->token);
  };
  const absl::StatusOr<SubmittedJob> job = Submit(*run, *coordinator);
  if (!job.ok()) {
    forget_credentials();
    return Fail(job.status());
  }
  // The job's records apart from the earlier jobs' in the folder.
  if (absl::Status st = StartJobRecords(run->dir, job->id, run->world); !st.ok()) {
    (void)CancelUntilFinal(*coordinator, job->id, "latchkey up could not keep the job's records");
    StopAll({coordinator->pid}, std::chrono::seconds(5));
    forget_credentials();
    return Fail(st);
  }
  // `latchkey logs JOB` and `latchkey checkpoints JOB` find the run folder through this.
  RunRecord record;
  record.job_id = job->id;
  record.run_dir = run->dir;
  record.checkpoint_dir = run->checkpoint_dir;
  record.world = run->world;
  record.coordinator = coordinator->ctx.coordinator;
  record.job_uid = job->uid;
  if (absl::Status st = RecordRun(record); !st.ok()) {
    std::fprintf(stderr, "latchkey up: warning: cannot record the run in %s: %s\n",
                 RunRegistryPath().c_str(), std::string(st.message()).c_str());
  }
  const absl::StatusOr<Supervised> supervised =
      Supervise(o, *run, *coordinator, *job, sigs, forget_credentials);
  forget_credentials();
  if (!supervised.ok()) return Fail(supervised.status());
  return Finish(*run, *job, *supervised);
}

}  // namespace

void AddUpCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto opts = std::make_shared<UpOptions>();
  CLI::App* up = app.add_subcommand(
      "up", "Run a job locally: embedded coordinator + one worker process per rank");
  up->add_option("--spec", opts->spec,
                 "job spec JSON (default: the built-in job: the demo's layers with a 256-token "
                 "vocabulary, on synthetic data)");
  up->add_option("--run-dir", opts->run_dir, "folder for the database, logs, JSONL, weights");
  up->add_option(
        "--workers", opts->workers,
        "worker processes: one per rank, the spec's world size (any other number is refused)")
      ->check(Positive());
  up->add_option("--max-restarts", opts->max_restarts,
                 "recoveries before the job fails (replaces the spec's latchkey.max_restarts)")
      ->check(NonNegative());
  up->add_flag("--no-file-check", opts->no_file_check,
               "start without checking that the files the spec names exist and are readable");
  up->add_flag("--tls", opts->tls,
               "TLS on its coordinator's gRPC port: a CA and certificate made with openssl in "
               "RUN/tls, trusted by its workers and (through the credentials file) the CLI");
  up->add_option("--liveness-timeout", opts->liveness_s,
                 "seconds without a heartbeat before a worker counts as lost")
      ->check(Positive())
      ->capture_default_str();
  up->add_option("--collective-timeout", opts->collective_timeout_s,
                 "seconds a collective may block before a worker gives up")
      ->check(Positive())
      ->capture_default_str();
  up->callback([&ctx, opts, exit_code] { *exit_code = RunUp(ctx, *opts); });
}

}  // namespace latchkey::cli
