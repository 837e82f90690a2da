// `latchkey list | status | cancel | update | latches`.
#include <iostream>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "client/cli/format.h"
#include "common/job_spec.h"
#include "proto/wire.h"

namespace latchkey::cli {

int Fail(const absl::Status& status) {
  std::cerr << "latchkey: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
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
    v1::ListJobsRequest req;
    for (const std::string& s : *states) {
      v1::JobState st;
      if (!v1::JobState_Parse("JOB_STATE_" + absl::AsciiStrToUpper(s), &st) ||
          st == v1::JOB_STATE_UNSPECIFIED) {
        std::cerr << "latchkey: --state: unknown state " << s << "\n";
        *exit_code = kUsage;
        return;
      }
      req.add_states(st);
    }
    req.set_page_size(*limit);
    JobClient client(ctx.client_options());
    auto resp = client.ListJobs(req);
    if (!resp.ok()) {
      *exit_code = Fail(resp.status());
      return;
    }
    if (ctx.json) {
      std::cout << ToJson(*resp) << std::endl;
    } else {
      std::cout << JobTableHeader() << "\n";
      for (const v1::Job& j : resp->jobs()) std::cout << JobTableRow(j) << "\n";
    }
    *exit_code = kOk;
  });
}

void AddStatusCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto job_id = std::make_shared<std::string>();
  CLI::App* sub = app.add_subcommand("status", "Show a job: state, workers, policy, last step");
  sub->add_option("job", *job_id, "job id")->required();
  sub->callback([job_id, &ctx, exit_code] {
    JobClient client(ctx.client_options());
    auto job = client.GetJob(*job_id);
    if (!job.ok()) {
      *exit_code = Fail(job.status());
      return;
    }
    std::cout << (ctx.json ? ToJson(*job) + "\n" : JobDetails(*job));
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
    std::cout << (ctx.json ? ToJson(*job)
                           : absl::StrCat(job->job_id(), " ", StateName(job->state())))
              << "\n";
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
    v1::UpdateJobPolicyRequest req;
    req.set_job_id(args->job_id);
    if (kv->count() > 0) {
      auto policy = ParseKvReducePolicy(args->kv_reduce);
      if (!policy) {
        std::cerr << "latchkey: --kv-reduce: unknown mode " << args->kv_reduce << "\n";
        *exit_code = kUsage;
        return;
      }
      req.set_kv_reduce(ToProto(*policy));
    }
    if (gas->count() > 0) req.mutable_gradient_accumulation_steps()->set_value(args->gas);
    if (args->expected_generation >= 0)
      req.mutable_expected_generation()->set_value(args->expected_generation);
    JobClient client(ctx.client_options());
    auto resp = client.UpdateJobPolicy(req);
    if (!resp.ok()) {
      *exit_code = Fail(resp.status());
      return;
    }
    if (ctx.json) {
      std::cout << ToJson(*resp) << "\n";
    } else {
      const v1::JobPolicy& p = resp->policy();
      std::cout << args->job_id << ": policy generation " << p.generation()
                << " (kv_reduce=" << KvReduceName(p.kv_reduce()) << " gas="
                << (p.gradient_accumulation_steps() > 0
                        ? std::to_string(p.gradient_accumulation_steps())
                        : std::string("spec"))
                << ") from window " << resp->first_window() << "\n";
    }
    *exit_code = kOk;
  });
}

void AddLatchesCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  auto job_id = std::make_shared<std::string>();
  auto start = std::make_shared<int64_t>(0);
  CLI::App* sub = app.add_subcommand("latches", "The audit of a job's published latches");
  sub->add_option("job", *job_id, "job id")->required();
  sub->add_option("--from", *start, "first window to show");
  sub->callback([job_id, start, &ctx, exit_code] {
    JobClient client(ctx.client_options());
    v1::ListLatchesRequest req;
    req.set_job_id(*job_id);
    req.set_start_window(*start);
    v1::ListLatchesResponse all;
    while (true) {
      auto page = client.ListLatches(req);
      if (!page.ok()) {
        *exit_code = Fail(page.status());
        return;
      }
      all.mutable_latches()->MergeFrom(page->latches());
      *all.mutable_policy_changes() = page->policy_changes();
      if (page->next_start_window() == 0) break;
      req.set_start_window(page->next_start_window());
    }
    if (ctx.json) {
      std::cout << ToJson(all) << "\n";
      *exit_code = kOk;
      return;
    }
    std::cout << LatchTableHeader() << "\n";
    for (const v1::Latch& l : all.latches()) std::cout << LatchRow(l) << "\n";
    for (const v1::PolicyChange& c : all.policy_changes()) {
      std::cout << "policy generation " << c.policy().generation() << " from window "
                << c.first_window() << ": kv_reduce=" << KvReduceName(c.policy().kv_reduce())
                << " gas=" << c.policy().gradient_accumulation_steps() << " at "
                << FormatTime(c.change_time()) << "\n";
    }
    *exit_code = kOk;
  });
}

}  // namespace latchkey::cli
