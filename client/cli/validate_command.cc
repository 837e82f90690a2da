// `latchkey validate SPEC` (and `submit --dry-run`): everything `submit` checks before it sends a
// spec (the file, the fields, the files the spec names), plus what the job will hold per rank,
// without a coordinator.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/cli.h"
#include "common/spec_files.h"
#include "common/spec_limits.h"

namespace latchkey::cli {
namespace {

// Marks the spec-file errors that are usage errors (exit 2): the file itself, not its content.
constexpr char kSpecUnreadable[] = "latchkey.cli/spec-unreadable";

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return absl::StrFormat(u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
}

}  // namespace

int SpecExitCode(const absl::Status& status) {
  const int code = Fail(status);
  return status.GetPayload(kSpecUnreadable).has_value() ? kUsage : code;
}

absl::StatusOr<JobSpec> LoadSpecForSubmit(const std::string& path, bool check_files,
                                          std::string* text, std::string* base_dir) {
  auto unreadable = [&](const std::string& why) {
    absl::Status st = absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
    st.SetPayload(kSpecUnreadable, absl::Cord("1"));
    return st;
  };
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    return unreadable(absl::StrCat("cannot read: ", std::strerror(errno)));
  // An ifstream opens a folder without complaint and reads nothing from it.
  if (S_ISDIR(st.st_mode)) {
    return unreadable("is a folder, not a job spec file (give the .json file in it)");
  }
  std::ifstream in(path);
  if (!in) return unreadable("cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  std::error_code ec;
  // Relative paths in the spec resolve against its folder, wherever the workers run.
  const auto abs = std::filesystem::absolute(path, ec);
  *base_dir = ec ? std::string() : abs.parent_path().string();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(*text, *base_dir);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
  }
  if (check_files) {
    if (absl::Status files = CheckSpecFiles(*spec); !files.ok()) {
      return absl::Status(files.code(),
                          absl::StrCat(path, ": ", files.message(),
                                       " (--no-file-check: the coordinator's workers see other "
                                       "files than this machine)"));
    }
  }
  return spec;
}

std::string DescribeValidSpec(const JobSpec& spec, bool files_checked) {
  std::string out;
  const int64_t params = ModelParameterCount(spec.model);
  const int dp = spec.dp();
  // What each rank keeps for the whole run (fp32 master weights and gradients, the optimizer's
  // state), with TP's shards and ZeRO's partitions over DP. Activations come on top; they depend
  // on the micro-batch and sequence length (docs/memory.md).
  const double per_rank_params = static_cast<double>(params) / spec.tp;
  const double optimizer_bytes = spec.optimizer.type == OptimizerType::kAdamW ? 8.0 : 0.0;
  const double weights = 4.0 * per_rank_params;
  const double grads = 4.0 * per_rank_params / (spec.zero_stage >= 2 ? dp : 1);
  const double optimizer = optimizer_bytes * per_rank_params / (spec.zero_stage >= 1 ? dp : 1);
  absl::StrAppend(&out, "spec:         valid\n");
  absl::StrAppend(&out, "world:        ", spec.world_size, " ranks (tp ", spec.tp, " x dp ", dp,
                  ")\n");
  absl::StrAppend(&out, "steps:        ", spec.steps, " (micro-batch ", spec.micro_batch_size,
                  ", gradient accumulation ", spec.gradient_accumulation_steps, ", seq_len ",
                  spec.seq_len, ")\n");
  absl::StrAppend(&out, "model:        ", params, " parameters (", spec.model.n_layer,
                  " layers, n_embd ", spec.model.n_embd, ", ", spec.model.n_head, " heads)\n");
  absl::StrAppend(&out, "memory/rank:  ", Bytes(weights + grads + optimizer), " (weights ",
                  Bytes(weights), ", gradients ", Bytes(grads), ", optimizer ", Bytes(optimizer),
                  "; activations not counted)\n");
  const std::string data =
      spec.data.tokens_file.empty()
          ? absl::StrCat("synthetic (seed ", spec.data.synthetic_seed.value_or(0), ")")
          : spec.data.tokens_file;
  absl::StrAppend(&out, "data:         ", data, "\n");
  if (spec.eval.enabled()) absl::StrAppend(&out, "eval:         ", spec.eval.tokens_file, "\n");
  if (!spec.init_from.empty()) absl::StrAppend(&out, "init_from:    ", spec.init_from, "\n");
  if (spec.checkpoint.enabled()) {
    absl::StrAppend(&out, "checkpoints:  ", spec.checkpoint.dir, "\n");
  }
  absl::StrAppend(&out, "files:        ",
                  files_checked ? "every file the spec names is readable here"
                                : "not checked (--no-file-check)",
                  "\n");
  for (const std::string& w : spec.warnings) absl::StrAppend(&out, "warning:      ", w, "\n");
  return out;
}

void AddValidateCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  struct Args {
    std::string spec_path;
    bool no_file_check = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "validate",
      "Check a job spec as submit would (fields, the files it names) and print the model's size "
      "and memory per rank; submits nothing");
  sub->add_option("spec", args->spec_path, "job spec file (docs/job-spec.md)")->required();
  sub->add_flag("--no-file-check", args->no_file_check,
                "do not check the files the spec names (they are on the workers' machines)");
  sub->callback([args, &ctx, exit_code] {
    std::string text;
    std::string base_dir;
    absl::StatusOr<JobSpec> spec =
        LoadSpecForSubmit(args->spec_path, !args->no_file_check, &text, &base_dir);
    if (!spec.ok()) {
      *exit_code = SpecExitCode(spec.status());
      return;
    }
    if (const std::string w = OtherJobsCheckpointsWarning(*spec); !w.empty()) {
      std::cerr << "warning: " << w << "\n";
    }
    if (ctx.json) {
      nlohmann::json j = {{"valid", true},
                          {"world_size", spec->world_size},
                          {"tp", spec->tp},
                          {"dp", spec->dp()},
                          {"steps", spec->steps},
                          {"parameters", ModelParameterCount(spec->model)},
                          {"files_checked", !args->no_file_check},
                          {"warnings", spec->warnings}};
      std::cout << j.dump() << "\n";
    } else {
      std::cout << DescribeValidSpec(*spec, !args->no_file_check);
    }
    *exit_code = kOk;
  });
}

}  // namespace latchkey::cli
