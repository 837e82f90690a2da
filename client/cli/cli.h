// Shared pieces of the `latchkey` CLI: exit codes, the global options every subcommand sees,
// and the registration function each subcommand file provides.
//
// Adding a subcommand (e.g. `latchkey up`): write up_command.cc with
//   void AddUpCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
// declare it here, call it from main.cc, and list the file in client/CMakeLists.txt.
#ifndef LATCHKEY_CLIENT_CLI_CLI_H_
#define LATCHKEY_CLIENT_CLI_CLI_H_

#include <functional>
#include <mutex>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "client/job_client.h"
#include "common/job_spec.h"
#include "common/timeouts.h"

namespace latchkey::cli {

// Exit codes scripts can rely on (also in `latchkey --help`).
enum ExitCode : int {
  kOk = 0,               // success; for submit --watch / watch: the job succeeded
  kError = 1,            // anything else (internal error, unexpected reply)
  kUsage = 2,            // bad command line, unreadable spec file
  kInvalid = 3,          // INVALID_ARGUMENT: spec or argument refused (message names the field)
  kNotFound = 4,         // NOT_FOUND: no such job
  kConflict = 5,         // FAILED_PRECONDITION / ABORTED: wrong state, stale generation
  kUnavailable = 6,      // UNAVAILABLE / DEADLINE_EXCEEDED: coordinator unreachable or slow
  kUnauthenticated = 7,  // UNAUTHENTICATED / PERMISSION_DENIED
  kDataLoss = 8,         // DATA_LOSS: a checkpoint file or piece does not match its checksum
  kJobFailed = 10,       // watched job ended failed
  kJobCancelled = 11,    // watched job ended cancelled
};

inline constexpr char kExitCodeHelp[] =
    "Exit codes: 0 ok (watch: job succeeded), 1 error, 2 usage, 3 invalid argument/spec, "
    "4 job not found, 5 wrong state/conflict, 6 coordinator unreachable/timeout, "
    "7 unauthenticated or permission denied (token), 8 checkpoint data loss (a file or piece "
    "that does not match its checksum), 10 watched job failed, 11 watched job "
    "cancelled.";

struct CliContext {
  std::string coordinator = kDefaultCoordinatorAddress;
  // Whether the address was given (--coordinator or $LATCHKEY_COORDINATOR) rather than the
  // default: `logs` and `checkpoints` then mean the job at that coordinator.
  bool coordinator_given = false;
  double timeout_s = absl::ToDoubleSeconds(absl::FromChrono(kDefaultRpcTimeout));
  bool json = false;  // machine-readable output where a command supports it
  // How long a watch keeps reopening its stream while the coordinator is unreachable; 0: the
  // call timeout (`latchkey up` waits out a restart of its coordinator).
  double watch_reconnect_s = 0;
  // --token / LATCHKEY_TOKEN, --tls-ca / LATCHKEY_TLS_CA, --tls-cert, --tls-key
  // (LATCHKEY_TLS_CERT, LATCHKEY_TLS_KEY). The credentials file's entry for the coordinator
  // (client/credentials.h) supplies the token when none is given, and the CA when none is given.
  ChannelCredentials credentials{};
  std::string credentials_file{};  // default DefaultCredentialsPath()

  // The options of a JobClient for the coordinator, the credentials file consulted.
  ClientOptions client_options() const;
};

// Prints "latchkey: <message>" to stderr and returns the exit code for the status's code (kUsage
// for a status IsSpecUnreadable marks).
int Fail(const absl::Status& status);

// The join token in `path`, surrounding whitespace dropped (as latchkey-worker reads
// --join-token-file); INVALID_ARGUMENT naming --join-token-file (submit_watch.cc).
absl::StatusOr<std::string> ReadJoinTokenFile(const std::string& path);

// Subcommands. Each registers itself on `app`; when it runs it stores its exit code.
void AddSubmitCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
void AddWatchCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
void AddListCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
void AddStatusCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
void AddCancelCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
void AddResumeCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
void AddSuspendCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
void AddUpdateCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
void AddLatchesCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
void AddUpCommand(CLI::App& app, const CliContext& ctx, int* exit_code);    // up_command.cc
void AddNodeCommand(CLI::App& app, const CliContext& ctx, int* exit_code);  // node_command.cc
// checkpoint_command.cc: `checkpoint inspect | export | convert` (no coordinator).
void AddCheckpointCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
// What `submit`, `up` and `validate` warn of (checkpoint_command.cc) when the spec's
// latchkey.checkpoint.dir, read on this machine, already holds committed checkpoints: a job not
// yet submitted has none, so they are other jobs'. Names the folder, each job (id, uid, steps)
// and that they are kept and never touched. "" when there are none (or no checkpointing).
std::string OtherJobsCheckpointsWarning(const JobSpec& spec);
// validate_command.cc: `validate SPEC` (also what `submit --dry-run` prints): no coordinator.
void AddValidateCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
// run_commands.cc: `logs JOB` and `checkpoints JOB`, from the run folder `up` ran JOB in.
void AddLogsCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
void AddCheckpointsCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
// `trace JOB`: the ranks' spans as one Chrome Trace Event file (client/trace_file.h).
void AddTraceCommand(CLI::App& app, const CliContext& ctx, int* exit_code);
// completion_command.cc: `completion bash|zsh`, from the commands and options registered on
// `app` (register it last).
void AddCompletionCommand(CLI::App& app, int* exit_code);

// The spec at `path` read, parsed and (when `check_files`) its files checked, as submit, up
// and validate do. The spec file itself: NOT_FOUND "PATH: cannot open the job spec: No such
// file or directory" (PERMISSION_DENIED when it may not be read), INVALID_ARGUMENT "PATH: is a
// folder, ..."; these carry kSpecUnreadablePayload (exit 2, usage). A refused field or an
// unreadable file the spec names is INVALID_ARGUMENT naming the path and field (exit 3). `text`
// and `base_dir` receive what is submitted.
absl::StatusOr<JobSpec> LoadSpecForSubmit(const std::string& path, bool check_files,
                                          std::string* text, std::string* base_dir);
// Marks LoadSpecForSubmit's errors about the spec file itself (not its content): Fail returns
// kUsage for them whatever their code.
inline constexpr char kSpecUnreadablePayload[] = "latchkey.cli/spec-unreadable";
bool IsSpecUnreadable(const absl::Status& status);
// `status` with `prefix` before its message, its code and payloads kept.
absl::Status WithPrefix(absl::string_view prefix, const absl::Status& status);
// The exit code for LoadSpecForSubmit's error, printed as Fail prints it: 2 (usage) when the spec
// file itself cannot be read or is a folder, else Fail's code (3 for a refused field or file).
int SpecExitCode(const absl::Status& status);
// The text `validate` and `submit --dry-run` print for a spec that passed LoadSpecForSubmit:
// world and layout, steps, files, the model's parameter count and a per-rank memory estimate.
std::string DescribeValidSpec(const JobSpec& spec, bool files_checked);

// What a caller of WatchUntilEnd may add: a look at every update before its line is printed
// (`latchkey up`'s supervisor), and the job as the watch last saw it.
struct WatchHooks {
  std::function<void(const JobInfo&)> on_job;
  JobInfo* last_job = nullptr;
  // Show the steps completed before the watch began too (those the coordinator still holds):
  // `up` watches its own job from its start.
  bool replay_recent_steps = false;
};

// Follows a job until it ends, printing progress (a live bar on a terminal, one line per step
// otherwise). Returns kOk / kJobFailed / kJobCancelled, or the error's code.
int WatchUntilEnd(const CliContext& ctx, const std::string& job_id, double max_seconds,
                  const WatchHooks& hooks = {});

// Held while a line goes to stdout from a thread other than the watch's (or by the watch), so
// that lines never interleave.
std::mutex& OutputMutex();
// Whether stdout is a terminal showing a live progress bar (a line printed over it clears it).
bool LiveProgress(const CliContext& ctx);

}  // namespace latchkey::cli

#endif  // LATCHKEY_CLIENT_CLI_CLI_H_
