// `latchkey list | status | cancel | resume | update | latches`.
#include <sys/stat.h>

#include <iostream>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"
#include "client/cli/format.h"
#include "client/cli/up.h"
#include "client/credentials.h"
#include "common/job_spec.h"
#include "common/states.h"
#include "proto/wire.h"

namespace latchkey::cli {

namespace {

// Why the credentials file gave no token, said with an UNAUTHENTICATED answer (Fail): which file,
// and which coordinators it has entries for.
std::string& CredentialsNote() {
  static std::string note;
  return note;
}

}  // namespace

ClientOptions CliContext::client_options() const {
  ClientOptions o;
  o.coordinator = coordinator;
  o.timeout = absl::Seconds(timeout_s);
  o.watch_reconnect = absl::Seconds(watch_reconnect_s);
  o.credentials = credentials;
  // The file's token only when none is given; its CA (no secret) whenever none is given.
  if (o.credentials.token.empty() || o.credentials.tls_ca.empty()) {
    const std::string path = credentials_file.empty() ? DefaultCredentialsPath() : credentials_file;
    struct stat st {};
    static bool warned = false;
    if (!warned && !path.empty() && stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      warned = true;
      std::cerr << "latchkey: warning: credentials file " << path << " holds tokens and is "
                << "readable by others (mode " << absl::StrFormat("%04o", st.st_mode & 0777)
                << "): chmod 600 " << path << "\n";
    }
    auto stored = LookupCredentials(path, coordinator);
    if (!stored.ok()) {
      std::cerr << "latchkey: warning: " << stored.status().message() << "\n";
    } else if (stored->has_value()) {
      if (o.credentials.token.empty()) o.credentials.token = (*stored)->token;
      if (o.credentials.tls_ca.empty()) o.credentials.tls_ca = (*stored)->tls_ca;
    } else if (o.credentials.token.empty() && !path.empty()) {
      const std::vector<std::string> entries = CredentialsEntries(path);
      CredentialsNote() = absl::StrCat(
          "no token given and the credentials file ", path, " has no entry for ", coordinator,
          entries.empty() ? std::string(" (it has none)")
                          : absl::StrCat(" (it has entries for ", absl::StrJoin(entries, ", "),
                                         ": pass --coordinator with one of them)"));
    }
  }
  return o;
}

int Fail(const absl::Status& status) {
  std::cerr << "latchkey: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  if (absl::IsUnauthenticated(status) && !CredentialsNote().empty()) {
    std::cerr << "latchkey: " << CredentialsNote() << "\n";
  }
  if (IsSpecUnreadable(status)) return kUsage;  // the spec file itself: a usage error
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return kInvalid;
    case absl::StatusCode::kNotFound:
      return kNotFound;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kResourceExhausted:
      return kConflict;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kUnavailable;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return kUnauthenticated;
    case absl::StatusCode::kDataLoss:
      return kDataLoss;
    default:
      return kError;
  }
}

void AddListCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto states = std::make_shared<std::vector<std::string>>();
  auto limit = std::make_shared<int>(0);
  CLI::App* sub = app.add_subcommand("list", "List jobs, newest first");
  sub->add_option("--state", *states, "only these states (pending, running, succeeded, ...)");
  sub->add_option("--limit", *limit, "at most this many (default 100)");
  sub->callback([states, limit, &ctx, exit_code] {
    std::vector<JobState> wanted;
    for (const std::string& s : *states) {
      const std::optional<JobState> st = ParseJobState(absl::AsciiStrToLower(s));
      if (!st) {
        std::cerr << "latchkey: --state: unknown state " << s
                  << " (pending, running, recovering, succeeded, failed, cancelled)\n";
        *exit_code = kInvalid;
        return;
      }
      wanted.push_back(*st);
    }
    JobClient client(ctx.client_options());
    auto jobs = client.ListJobs(wanted, *limit);
    if (!jobs.ok()) {
      *exit_code = Fail(jobs.status());
      return;
    }
    if (ctx.json) {
      std::cout << ToJson(ToProto(*jobs)) << std::endl;
    } else {
      std::cout << JobTableHeader() << "\n";
      for (const JobInfo& j : *jobs) std::cout << JobTableRow(j) << "\n";
    }
    *exit_code = kOk;
  });
}

void AddStatusCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto job_id = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "status",
      "Show a job: state, workers, policy, last step (a job whose `latchkey up` ended: exit 5, "
      "naming its run folder)");
  sub->add_option("job", *job_id, "job id")->required();
  sub->callback([job_id, &ctx, exit_code] {
    JobClient client(ctx.client_options());
    auto job = client.GetJob(*job_id);
    if (!job.ok()) {
      // No coordinator answers: a job `up` ran may have ended with its `up` (exit 5, saying
      // where its records are), or run under one at another address.
      *exit_code =
          Fail(absl::IsUnavailable(job.status())
                   ? ExplainUnreachableJob(*job_id, ctx.coordinator_given ? ctx.coordinator : "",
                                           job.status())
                   : job.status());
      return;
    }
    std::cout << (ctx.json ? StatusJson(*job) + "\n" : JobDetails(*job));
    *exit_code = kOk;
  });
}

void AddCancelCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto job_id = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("cancel", "Cancel a pending or running job");
  sub->add_option("job", *job_id, "job id")->required();
  sub->add_option("--reason", *reason, "recorded with the job");
  sub->callback([job_id, reason, &ctx, exit_code] {
    JobClient client(ctx.client_options());
    auto job = client.CancelJob(*job_id, *reason);
    if (!job.ok()) {
      *exit_code = Fail(job.status());
      return;
    }
    std::cout << (ctx.json ? ToJson(ToProto(*job))
                           : absl::StrCat(job->job_id, " ", JobStateName(job->state)))
              << "\n";
    *exit_code = kOk;
  });
}

// A failed or cancelled job continues from its newest committed checkpoint as a new attempt;
// the line says where it resumes, since the user starts the workers again next.
void AddResumeCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto job_id = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "resume",
      "Continue a failed, cancelled or suspended job from its last checkpoint (a new attempt)");
  sub->add_option("job", *job_id, "job id")->required();
  sub->add_option("--reason", *reason, "recorded with the resumed attempt");
  sub->callback([job_id, reason, &ctx, exit_code] {
    JobClient client(ctx.client_options());
    auto job = client.ResumeJob(*job_id, *reason);
    if (!job.ok()) {
      *exit_code = Fail(job.status());
      return;
    }
    if (ctx.json) {
      std::cout << ToJson(ToProto(*job)) << "\n";
    } else {
      std::cout << job->job_id << " " << JobStateName(job->state) << " (attempt " << job->attempt
                << ", "
                << (job->resume_step >= 0
                        ? absl::StrCat("resumes from the checkpoint after step ", job->resume_step)
                        : std::string("no checkpoint: resumes from the start"))
                << "); start its workers again\n";
    }
    *exit_code = kOk;
  });
}

// A running job saves its last completed step with every rank and stops; it waits, suspended,
// for `latchkey resume` (what a queue's suspend maps onto: the machines are free, nothing lost).
void AddSuspendCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto job_id = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand(
      "suspend", "Save a running job's last completed step and stop it until `latchkey resume`");
  sub->add_option("job", *job_id, "job id")->required();
  sub->add_option("--reason", *reason, "recorded with the job");
  sub->callback([job_id, reason, &ctx, exit_code] {
    JobClient client(ctx.client_options());
    auto job = client.SuspendJob(*job_id, *reason);
    if (!job.ok()) {
      *exit_code = Fail(job.status());
      return;
    }
    if (ctx.json) {
      std::cout << ToJson(ToProto(*job)) << "\n";
    } else if (job->state == JobState::kSuspended) {
      std::cout << job->job_id << " suspended\n";
    } else {
      std::cout << job->job_id << " " << JobStateName(job->state)
                << ": suspending (its ranks save the last completed step and stop; `latchkey "
                   "watch "
                << job->job_id << "` follows it)\n";
    }
    *exit_code = kOk;
  });
}

void AddUpdateCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  struct Args {
    std::string job_id;
    std::string kv_reduce;
    int gas = 0;
    int64_t expected_generation = -1;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "update", "Change a job's policy from the first window not yet published (all ranks alike)");
  sub->add_option("job", args->job_id, "job id")->required();
  auto* kv = sub->add_option("--kv-reduce", args->kv_reduce,
                             "auto | per_micro_batch | deferred | coalesced");
  auto* gas = sub->add_option("--gas", args->gas, "gradient accumulation steps (>= 1)");
  sub->add_option("--expected-generation", args->expected_generation,
                  "apply only if the policy is still at this generation");
  sub->callback([args, kv, gas, &ctx, exit_code] {
    if (kv->count() == 0 && gas->count() == 0) {
      std::cerr << "latchkey: update: give --kv-reduce and/or --gas\n";
      *exit_code = kUsage;
      return;
    }
    JobPolicyUpdate update;
    update.job_id = args->job_id;
    if (kv->count() > 0) {
      update.kv_reduce = ParseKvReducePolicy(args->kv_reduce);
      if (!update.kv_reduce) {
        std::cerr << "latchkey: --kv-reduce: unknown mode " << args->kv_reduce
                  << " (auto, per_micro_batch, deferred, coalesced)\n";
        *exit_code = kInvalid;
        return;
      }
    }
    if (gas->count() > 0) update.gradient_accumulation_steps = args->gas;
    if (args->expected_generation >= 0) update.expected_generation = args->expected_generation;
    JobClient client(ctx.client_options());
    auto resp = client.UpdateJobPolicy(update);
    if (!resp.ok()) {
      *exit_code = Fail(resp.status());
      return;
    }
    if (ctx.json) {
      std::cout << ToJson(ToProto(*resp)) << "\n";
    } else {
      std::cout << args->job_id << ": policy generation " << resp->policy.generation << " ("
                << PolicySummary(resp->policy) << ") from window " << resp->first_window << "\n";
    }
    *exit_code = kOk;
  });
}

void AddLatchesCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto job_id = std::make_shared<std::string>();
  auto start = std::make_shared<int64_t>(0);
  CLI::App* sub = app.add_subcommand(
      "latches",
      "The audit of a job: its published latches, policy changes and events (recoveries, stall "
      "verdicts, determinism violations, checkpoints, fenced workers, cancels, a diverged "
      "training, stragglers named and cleared, changes of the micro-batches per DP replica)");
  sub->alias("audit");
  sub->add_option("job", *job_id, "job id")->required();
  sub->add_option("--from", *start, "first window to show");
  sub->callback([job_id, start, &ctx, exit_code] {
    JobClient client(ctx.client_options());
    auto all = client.ListAllLatches(*job_id, *start);
    if (!all.ok()) {
      *exit_code = Fail(all.status());
      return;
    }
    if (ctx.json) {
      std::cout << ToJson(ToProto(*all)) << "\n";
      *exit_code = kOk;
      return;
    }
    std::cout << LatchTableHeader() << "\n";
    for (const AuditedLatch& l : all->latches) std::cout << LatchRow(l.latch) << "\n";
    for (const AuditedPolicyChange& c : all->policy_changes) {
      std::cout << PolicyChangeLine(c) << "\n";
    }
    if (!all->events.empty()) {
      std::cout << "\n" << EventTableHeader() << "\n";
      for (const AuditedEvent& e : all->events) std::cout << EventRow(e) << "\n";
    }
    *exit_code = kOk;
  });
}

}  // namespace latchkey::cli
