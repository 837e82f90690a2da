// latchkey-worker's command line: the flag table (worker_flags.cc), the options it fills, and
// the usage text. main.cc parses with ParseWorkerFlags, checks the mode's required flags with
// ValidateWorkerFlags, then runs the mode.
//
// Every refusal is a usage error: an INVALID_ARGUMENT whose message main prints as
// "latchkey-worker: <message>" followed by kWorkerUsage, exiting 2. Flags not given keep the
// values the environment gave (ReadWorkerEnv: LATCHKEY_COORDINATOR, LATCHKEY_JOB_ID,
// LATCHKEY_JOIN_TOKEN, LATCHKEY_TLS_*). Thread-safety: free functions on values; parsing
// writes the --join-token warning to stderr.
#ifndef LATCHKEY_WORKER_RUNNER_WORKER_FLAGS_H_
#define LATCHKEY_WORKER_RUNNER_WORKER_FLAGS_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/timeouts.h"
#include "worker/runner/env.h"
#include "worker/runner/run_rank.h"

namespace latchkey {

extern const char kWorkerUsage[];

struct WorkerFlags {
  bool standalone = false;  // --standalone (else: coordinator mode)
  bool resume = false;      // --resume (standalone only)
  std::string resume_from;  // --resume-from DIR (standalone only): one step-N folder
  std::string spec_path;    // --spec
  std::string coordinator;  // --coordinator, else LATCHKEY_COORDINATOR
  std::string job;          // --job, else LATCHKEY_JOB_ID
  std::string token;        // --join-token, else LATCHKEY_JOIN_TOKEN
  std::string token_file;   // --join-token-file (read by main: it replaces `token`)
  std::string advertise;    // --advertise-host
  std::string tls_ca;       // --tls-ca, else LATCHKEY_TLS_CA
  std::string tls_cert;     // --tls-cert, else LATCHKEY_TLS_CERT
  std::string tls_key;      // --tls-key, else LATCHKEY_TLS_KEY
  std::chrono::milliseconds collective_timeout{kDefaultCollectiveTimeout};
  // --join-timeout S: how long coordinator mode waits for the coordinator to answer its join.
  std::chrono::milliseconds join_timeout{kDefaultJoinTimeout};
  RunOptions run;  // outputs, --save, engine and test-only options
};

// The flags after the program name (not `tokenize`, not --help), over the environment's
// defaults. The first refusal names its flag.
absl::StatusOr<WorkerFlags> ParseWorkerFlags(const std::vector<std::string>& args,
                                             const WorkerEnv& env);

// What each mode needs, in the order it is checked: --standalone needs --spec; --resume and
// --resume-from exclude each other and are for --standalone; coordinator mode needs a job id.
// (--resume against the spec's latchkey.checkpoint is the standalone run's own check:
// standalone.h.)
absl::Status ValidateWorkerFlags(const WorkerFlags& flags);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_WORKER_FLAGS_H_
