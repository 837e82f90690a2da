// latchkey-worker: one rank of a latchkey job.
//
//   latchkey-worker --coordinator HOST:PORT --job JOB_ID [--join-token-file F] [outputs...]
//       joins a job at the coordinator (flags or LATCHKEY_COORDINATOR, LATCHKEY_JOB_ID; the
//       join token from LATCHKEY_JOIN_TOKEN or --join-token-file: --join-token TOKEN works but
//       shows the token to `ps` and warns; RANK (else JOB_COMPLETION_INDEX, a Kubernetes
//       Indexed Job's pod), when set, asks for that rank; LATCHKEY_NODE_NAME names the node it
//       runs on, as `latchkey node` sets it, else its host does). TLS to the
//       coordinator: --tls-ca F (LATCHKEY_TLS_CA), mTLS also --tls-cert F --tls-key F
//       (LATCHKEY_TLS_CERT, LATCHKEY_TLS_KEY).
//   latchkey-worker --standalone --spec SPEC.json [outputs...]
//       torchrun-style env: RANK, WORLD_SIZE (default 0 and 1), MASTER_ADDR (127.0.0.1),
//       MASTER_PORT (29500), LOCAL_WORLD_SIZE (ranks on this machine; default WORLD_SIZE).
//       --resume continues after the newest valid checkpoint in the spec's
//       latchkey.checkpoint.dir (step 0 when there is none); every rank must be given it.
//   latchkey-worker tokenize TEXT_FILE OUT.bin      byte-level (vocab 256) uint16 tokens
//   latchkey-worker --version     version, git commit, libtorch version, CUDA on/off
//
// The flags are a table in worker_flags.cc; main reads the environment, parses and checks the
// flags, then runs the mode.
//
// Exit 0 on success; otherwise one line "latchkey-worker: <field>: <reason>" and exit 1
// (2 for a usage error; kExitTrainingDiverged, 3, when the training diverged: a non-finite loss
// or gradient norm, "loss is NaN at step 1 (rank 0)", after which no supervisor restarts it;
// 75, kExitRestartMe, from a worker stuck in a fenced attempt; 76, kExitPreempted, from a worker
// that left on SIGTERM or SIGINT, after its attempt saved or when its grace ran out).
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "common/error_info.h"
#include "common/job_spec.h"
#include "common/worker_protocol.h"
#include "latchkey_version.h"
#include "worker/data/token_source.h"
#include "worker/memory/memory.h"
#include "worker/runner/env.h"
#include "worker/runner/standalone.h"
#include "worker/runner/worker_flags.h"
#ifdef LATCHKEY_WITH_COORDINATOR
#include "worker/runner/coordinated.h"
#endif

namespace {

constexpr int kRunFailed = 1;
constexpr int kUsageExit = 2;

int UsageError(const std::string& msg) {
  std::cerr << "latchkey-worker: " << msg << "\n" << latchkey::kWorkerUsage;
  return kUsageExit;
}

int RunFailed(absl::string_view msg) {
  std::cerr << "latchkey-worker: " << msg << "\n";
  return kRunFailed;
}

// The run's end: 0, or its error's line and exit code (a diverged training's own).
int RunEnded(const absl::Status& st) {
  if (st.ok()) return 0;
  int code = latchkey::HasErrorReason(st, latchkey::error_reason::kTrainingDiverged)
                 ? latchkey::kExitTrainingDiverged
                 : kRunFailed;
  if (latchkey::HasErrorReason(st, latchkey::error_reason::kAttemptStopped) ||
      latchkey::HasErrorReason(st, latchkey::error_reason::kJobSuspended)) {
    code = latchkey::kExitPreempted;  // left on a stop signal: a replacement takes its rank
  }
  std::cerr << "latchkey-worker: " << st.message() << "\n";
  return code;
}

int Tokenize(const std::vector<std::string>& args) {
  if (args.size() != 3) return UsageError("tokenize takes TEXT_FILE OUT.bin");
  auto n = latchkey::TokenizeBytesFile(args[1], args[2]);
  if (!n.ok()) return RunFailed(n.status().message());
  std::cout << "wrote " << *n << " tokens (uint16, vocab 256) to " << args[2] << "\n";
  return 0;
}

// The spec is read once, here; a spec that does not load is the run's error (naming its
// field), a --resume it cannot honour a usage error.
int Standalone(const latchkey::WorkerFlags& flags, const latchkey::WorkerEnv& env) {
  latchkey::StandaloneOptions opts;
  opts.spec_path = flags.spec_path;
  opts.run = flags.run;
  opts.collective_timeout = flags.collective_timeout;
  opts.resume = flags.resume;
  opts.resume_from = flags.resume_from;
  absl::StatusOr<latchkey::JobSpec> spec = latchkey::LoadJobSpecFile(opts.spec_path);
  if (!spec.ok()) return RunFailed(spec.status().message());
  if (absl::Status st = latchkey::CheckStandaloneOptions(opts, *spec); !st.ok()) {
    return UsageError(std::string(st.message()));
  }
  return RunEnded(latchkey::RunStandalone(opts, *std::move(spec), env));
}

#ifdef LATCHKEY_WITH_COORDINATOR
int Coordinated(const latchkey::WorkerFlags& flags, const latchkey::WorkerEnv& env) {
  latchkey::CoordinatedOptions opts;
  if (!flags.coordinator.empty()) opts.coordinator = flags.coordinator;
  opts.job_id = flags.job;
  opts.join_token = flags.token;
  if (!flags.token_file.empty()) {
    auto from_file = latchkey::ReadJoinTokenFile(flags.token_file);
    if (!from_file.ok()) return UsageError(std::string(from_file.status().message()));
    opts.join_token = *from_file;
  }
  if (opts.join_token.empty()) {
    return UsageError(
        "no join token: set LATCHKEY_JOIN_TOKEN or --join-token-file (the "
        "join_token `latchkey submit` printed)");
  }
  opts.credentials.tls_ca = flags.tls_ca;
  opts.credentials.tls_cert = flags.tls_cert;
  opts.credentials.tls_key = flags.tls_key;
  opts.advertise_host = flags.advertise;
  if (env.rank) opts.requested_rank = *env.rank;
  opts.run = flags.run;
  opts.collective_timeout = flags.collective_timeout;
  opts.join_timeout = flags.join_timeout;
  return RunEnded(latchkey::RunCoordinated(opts, env));
}
#endif

}  // namespace

// When stderr is a file (a launcher's log, e.g. `latchkey up`'s RUN/worker-R.log), its path, so
// that the log says where it is and `ps`-level debugging finds it; "" otherwise.
std::string StderrLogPath() {
  struct stat st {};
  if (fstat(STDERR_FILENO, &st) != 0 || !S_ISREG(st.st_mode)) return "";
  char path[4096];
  const ssize_t n = readlink("/proc/self/fd/2", path, sizeof(path) - 1);
  if (n <= 0) return "";
  return std::string(path, static_cast<size_t>(n));
}

int main(int argc, char** argv) {
  // Every tensor of this process is counted (worker/memory/memory.h): installed before any.
  if (absl::Status st = latchkey::memory::InstallCountingCpuAllocator(); !st.ok()) {
    return RunFailed(st.message());
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << latchkey::kWorkerUsage;
    return args.empty() ? kUsageExit : 0;
  }
  if (args[0] == "--version") {
    std::cout << LATCHKEY_VERSION_LINE("latchkey-worker") << "\n";
    return 0;
  }
  if (args[0] == "tokenize") return Tokenize(args);
  if (const std::string log = StderrLogPath(); !log.empty()) {
    // Not prefixed "latchkey-worker:", which starts the lines that report an error.
    std::cerr << "worker pid " << getpid() << " logs to " << log << std::endl;
  }
  absl::StatusOr<latchkey::WorkerEnv> env = latchkey::ReadWorkerEnv();
  if (!env.ok()) return RunFailed(env.status().message());
  absl::StatusOr<latchkey::WorkerFlags> flags = latchkey::ParseWorkerFlags(args, *env);
  if (!flags.ok()) return UsageError(std::string(flags.status().message()));
  if (absl::Status st = latchkey::ValidateWorkerFlags(*flags); !st.ok()) {
    return UsageError(std::string(st.message()));
  }
#ifdef LATCHKEY_WITH_COORDINATOR
  if (!flags->standalone) return Coordinated(*flags, *env);
#endif
  return Standalone(*flags, *env);
}
