// `latchkey submit SPEC.json [--watch]` and `latchkey watch JOB`.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "client/cli/format.h"
#include "client/credentials.h"
#include "proto/wire.h"

namespace latchkey::cli {

std::mutex& OutputMutex() {
  static std::mutex mu;
  return mu;
}

bool LiveProgress(const CliContext& ctx) { return isatty(STDOUT_FILENO) && !ctx.json; }

int WatchUntilEnd(const CliContext& ctx, const std::string& job_id, double max_seconds,
                  const WatchHooks& hooks) {
  JobClient client(ctx.client_options());
  const bool tty = LiveProgress(ctx);
  const absl::Time deadline =
      max_seconds > 0 ? absl::Now() + absl::Seconds(max_seconds) : absl::InfiniteFuture();
  std::string last_line;
  std::set<int> named;  // the ranks a straggler line was printed for
  auto on_update = [&](const JobUpdate& m) {
    if (hooks.on_job) hooks.on_job(m.job);
    if (hooks.last_job) *hooks.last_job = m.job;
    std::lock_guard<std::mutex> lock(OutputMutex());
    if (ctx.json) {
      std::cout << ToJson(ToProto(m)) << std::endl;
      return true;
    }
    // A line per rank named slow, and one when it is no longer (docs/fault-tolerance.md).
    std::set<int> now;
    for (const StragglerInfo& s : m.job.stragglers) {
      now.insert(s.rank);
      if (named.count(s.rank)) continue;
      std::cout << (tty ? "\r\033[K" : "") << "straggler: " << StragglerLine(s) << std::endl;
    }
    for (int rank : named) {
      if (!now.count(rank)) {
        std::cout << (tty ? "\r\033[K" : "") << "straggler: rank " << rank << " is no longer slow"
                  << std::endl;
      }
    }
    named = std::move(now);
    const std::string line = ProgressLine(m.job, m.step ? &*m.step : nullptr);
    if (line == last_line) return true;
    last_line = line;
    if (tty && m.step && m.step->report.eval_loss) {
      std::cout << "\r\033[K" << line << std::endl;  // an evaluated step's line stays
    } else if (tty) {
      std::cout << "\r\033[K" << line << std::flush;  // redraw the bar in place
    } else {
      std::cout << line << std::endl;
    }
    return true;
  };
  auto final_job = client.WatchJob(job_id, on_update, deadline, hooks.replay_recent_steps);
  if (tty) std::cout << std::endl;
  if (final_job.ok() && hooks.last_job) *hooks.last_job = *final_job;
  if (!final_job.ok()) return Fail(final_job.status());
  switch (final_job->state) {
    case JobState::kSucceeded:
      return kOk;
    case JobState::kCancelled:
      std::cerr << "latchkey: " << job_id << " cancelled: " << final_job->failure_reason << "\n";
      return kJobCancelled;
    case JobState::kFailed:
      std::cerr << "latchkey: " << job_id << " failed: " << final_job->failure_reason << "\n";
      return kJobFailed;
    case JobState::kPending:
    case JobState::kRunning:
    case JobState::kRecovering:
    case JobState::kPreempted:
    case JobState::kSuspended:
      break;
  }
  return kError;  // the stream ended while the job had not
}

absl::StatusOr<std::string> ReadJoinTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError("--join-token-file: cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const size_t b = text.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) {
    return absl::InvalidArgumentError("--join-token-file: '" + path + "' is empty");
  }
  return text.substr(b, text.find_last_not_of(" \t\r\n") - b + 1);
}

void AddSubmitCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  struct Args {
    std::string spec_path;
    bool watch = false;
    std::string rendezvous_host;
    int rendezvous_port = 0;
    double watch_seconds = 0;
    std::string job_id;
    std::string join_token_sha256;
    std::string join_token_file;
    bool dry_run = false;
    bool no_file_check = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("submit", "Submit a job spec (JSON); prints its id and token");
  sub->add_option("spec", args->spec_path, "job spec file (docs/job-spec.md)")->required();
  sub->add_flag("--watch", args->watch, "follow the job until it ends (exit code says how)");
  sub->add_option("--rendezvous-host", args->rendezvous_host,
                  "host rank 0's store listens on (default: rank 0's own address)");
  sub->add_option("--rendezvous-port", args->rendezvous_port,
                  "port rank 0's store listens on (default: one from the coordinator's range)");
  sub->add_option("--watch-timeout", args->watch_seconds,
                  "with --watch: give up after this many seconds (0: never)");
  sub->add_option("--job-id", args->job_id,
                  "the job's id, chosen here (a DNS label); submitting the same id and spec "
                  "again returns that job (default $LATCHKEY_JOB_ID, else one the coordinator "
                  "assigns)")
      ->envname("LATCHKEY_JOB_ID");
  auto* hash = sub->add_option("--join-token-sha256", args->join_token_sha256,
                               "SHA-256 (hex) of the join token the workers will present");
  sub->add_option("--join-token-file", args->join_token_file,
                  "file holding the join token the workers will present (hashed here; the "
                  "token is never sent)")
      ->excludes(hash);
  sub->add_flag("--dry-run", args->dry_run,
                "check everything submit checks and print what `validate` prints; submit nothing");
  sub->add_flag("--no-file-check", args->no_file_check,
                "do not check here that the files the spec names exist and are readable (they "
                "are on the workers' machines, not this one)");
  sub->callback([args, &ctx, exit_code] {
    JobSubmission submission;
    // The spec is checked here first (a folder, a refused field, a file it names that cannot be
    // read): the user hears of it now, not from the job's failure.
    const absl::StatusOr<JobSpec> spec = LoadSpecForSubmit(
        args->spec_path, !args->no_file_check, &submission.spec_json, &submission.base_dir);
    if (!spec.ok()) {
      *exit_code = SpecExitCode(spec.status());
      return;
    }
    // Checked here, on the machine submit runs on: the coordinator may not see the folder.
    if (const std::string w = OtherJobsCheckpointsWarning(*spec); !w.empty()) {
      std::cerr << "warning: " << w << "\n";
    }
    if (args->dry_run) {
      std::cout << DescribeValidSpec(*spec, !args->no_file_check) << "dry run: nothing submitted\n";
      *exit_code = kOk;
      return;
    }
    submission.rendezvous_host = args->rendezvous_host;
    submission.rendezvous_port = args->rendezvous_port;
    submission.job_id = args->job_id;
    submission.join_token_sha256 = args->join_token_sha256;
    if (!args->join_token_file.empty()) {
      auto token = ReadJoinTokenFile(args->join_token_file);
      if (!token.ok()) {
        std::cerr << "latchkey: " << token.status().message() << "\n";
        *exit_code = kUsage;
        return;
      }
      submission.join_token_sha256 = Sha256Hex(*token);
    }
    JobClient client(ctx.client_options());
    auto resp = client.SubmitJob(submission);
    if (!resp.ok()) {
      *exit_code = Fail(resp.status());
      return;
    }
    if (ctx.json) {
      std::cout << ToJson(ToProto(*resp)) << std::endl;
    } else {
      std::cout << "job_id: " << resp->job_id << "\n";
      if (!resp->join_token.empty()) std::cout << "join_token: " << resp->join_token << "\n";
      if (resp->already_submitted) {
        std::cout << "already_submitted: true (the same job id and spec; nothing created)\n";
      }
      for (const std::string& w : resp->job.warnings) std::cerr << "warning: " << w << "\n";
    }
    *exit_code = args->watch ? WatchUntilEnd(ctx, resp->job_id, args->watch_seconds) : kOk;
  });
}

void AddWatchCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto job_id = std::make_shared<std::string>();
  auto seconds = std::make_shared<double>(0);
  CLI::App* sub = app.add_subcommand(
      "watch", "Follow a job: step/steps, loss, tokens/s, K/V all-reduces per step");
  sub->add_option("job", *job_id, "job id")->required();
  sub->add_option("--timeout-after", *seconds, "give up after this many seconds (0: never)");
  sub->callback(
      [job_id, seconds, &ctx, exit_code] { *exit_code = WatchUntilEnd(ctx, *job_id, *seconds); });
}

}  // namespace latchkey::cli
