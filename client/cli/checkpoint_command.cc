// `latchkey checkpoint inspect | export | convert`: resumable training checkpoints on disk, read
// with the torch-free checkpoint library (worker/checkpoint/checkpoint_tools.h); no coordinator.
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"
#include "worker/checkpoint/checkpoint_tools.h"
#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey::cli {

std::string OtherJobsCheckpointsWarning(const JobSpec& spec) {
  if (!spec.checkpoint.enabled()) return "";
  absl::StatusOr<std::vector<FoundCheckpoint>> found =
      ListCheckpoints(spec.checkpoint.dir, CheckpointOwner());
  if (!found.ok() || found->empty()) return "";
  // (job id, job uid) -> steps, oldest first.
  std::map<std::pair<std::string, std::string>, std::vector<int64_t>> jobs;
  for (const FoundCheckpoint& c : *found) {
    std::vector<int64_t>& steps = jobs[{c.manifest.job_id, c.manifest.job_uid}];
    steps.insert(steps.begin(), c.step);
  }
  constexpr size_t kStepsShown = 8;
  std::vector<std::string> parts;
  for (const auto& [job, steps] : jobs) {
    std::vector<int64_t> shown(steps.end() - std::min(steps.size(), kStepsShown), steps.end());
    parts.push_back(
        absl::StrCat(job.first, " (", job.second.empty() ? "no job_uid" : "job_uid " + job.second,
                     ", ", steps.size() == 1 ? "step " : "steps ",
                     steps.size() > shown.size() ? "... " : "", absl::StrJoin(shown, ", "), ")"));
  }
  return absl::StrCat(
      "latchkey.checkpoint.dir ", spec.checkpoint.dir,
      " already holds committed checkpoints of other jobs: ", absl::StrJoin(parts, "; "),
      ". They are kept and never touched: this job's checkpoints carry its own "
      "job uid, and it resumes from and prunes only those");
}

void AddCheckpointCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  (void)ctx;
  CLI::App* group = app.add_subcommand(
      "checkpoint", "Inspect, export or convert a training checkpoint folder (step-N)");
  group->require_subcommand(1);

  auto inspect_dir = std::make_shared<std::string>();
  CLI::App* inspect = group->add_subcommand(
      "inspect",
      "Print step, layout, model, tensors and sizes; verify every checksum (exit 8 "
      "naming the file when one does not match)");
  inspect->add_option("dir", *inspect_dir, "checkpoint folder (step-N)")->required();
  inspect->callback([inspect_dir, exit_code] {
    absl::StatusOr<std::string> report = InspectCheckpoint(*inspect_dir);
    if (!report.ok()) {
      *exit_code = Fail(report.status());
      return;
    }
    std::cout << *report;
    *exit_code = kOk;
  });

  auto export_dir = std::make_shared<std::string>();
  auto hf_out = std::make_shared<std::string>();
  CLI::App* exp = group->add_subcommand(
      "export",
      "Write the checkpoint's weights as one HF GPTBigCode folder (model.safetensors, "
      "config.json), whatever layout wrote it");
  exp->add_option("dir", *export_dir, "checkpoint folder (step-N)")->required();
  exp->add_option("--hf", *hf_out, "output folder")->required();
  exp->callback([export_dir, hf_out, exit_code] {
    if (absl::Status st = ExportCheckpointToHf(*export_dir, *hf_out); !st.ok()) {
      *exit_code = Fail(st);
      return;
    }
    std::cout << "wrote " << *hf_out << "\n";
    *exit_code = kOk;
  });

  auto src = std::make_shared<std::string>();
  auto dst = std::make_shared<std::string>();
  CLI::App* convert = group->add_subcommand(
      "convert",
      "Rewrite a latchkey-checkpoint/1 folder as latchkey-checkpoint/2 under DST "
      "(DST/step-N)");
  convert->add_option("src", *src, "version 1 checkpoint folder (step-N)")->required();
  convert->add_option("dst", *dst, "checkpoint root to write step-N into")->required();
  convert->callback([src, dst, exit_code] {
    absl::StatusOr<std::string> out = ConvertCheckpoint(*src, *dst);
    if (!out.ok()) {
      *exit_code = Fail(out.status());
      return;
    }
    std::cout << "wrote " << *out << "\n";
    *exit_code = kOk;
  });
}

}  // namespace latchkey::cli
