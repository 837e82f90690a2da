// `latchkey validate SPEC` (and `submit --dry-run`): everything `submit` checks before it sends a
// spec (the file, the fields, the files the spec names), plus what the job will hold per rank,
// without a coordinator.
#include <sys/stat.h>
#include <unistd.h>

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

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return absl::StrFormat(u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
}

const char* DtypeName(TokenDtype d) { return d == TokenDtype::kUint32 ? "uint32" : "uint16"; }

// latchkey.data as the spec says it: a token file, the synthetic source, or a Megatron dataset
// (one path_prefix or a blend with its weights) with its split, seed and sample count.
std::string DescribeData(const JobSpec& spec) {
  const DataConfig& d = spec.data;
  if (d.format == DataFormat::kMegatron) {
    std::string what = "megatron ";
    if (d.blend.empty()) {
      absl::StrAppend(&what, d.path_prefix);
    } else {
      absl::StrAppend(&what, "blend ");
      for (size_t i = 0; i < d.blend.size(); ++i) {
        absl::StrAppend(&what, i == 0 ? "" : ", ", absl::StrFormat("%g", d.blend[i].weight), " ",
                        d.blend[i].path_prefix);
      }
    }
    absl::StrAppend(&what, " (split ", d.split, ", seed ", d.megatron_seed, ", ", d.num_samples,
                    " samples)");
    return what;
  }
  if (d.synthetic_seed.has_value()) return absl::StrCat("synthetic (seed ", *d.synthetic_seed, ")");
  return absl::StrCat(d.tokens_file, " (", DtypeName(d.dtype), ")");
}

// latchkey.eval: a token file or a split of the Megatron dataset, how often and how many samples.
std::string DescribeEval(const EvalConfig& e) {
  const std::string source = e.split.empty()
                                 ? absl::StrCat(e.tokens_file, " (", DtypeName(e.dtype), ")")
                                 : absl::StrCat("the ", e.split, " split of the data");
  return absl::StrCat(source, ", every ", e.every_steps, e.every_steps == 1 ? " step" : " steps",
                      ", ", e.samples, e.samples == 1 ? " sample" : " samples");
}

}  // namespace

int SpecExitCode(const absl::Status& status) { return Fail(status); }

bool IsSpecUnreadable(const absl::Status& status) {
  return status.GetPayload(kSpecUnreadablePayload).has_value();
}

absl::Status WithPrefix(absl::string_view prefix, const absl::Status& status) {
  absl::Status out(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

absl::StatusOr<JobSpec> LoadSpecForSubmit(const std::string& path, bool check_files,
                                          std::string* text, std::string* base_dir) {
  // The file itself, not its content: NOT_FOUND when it is not there, PERMISSION_DENIED when it
  // may not be read, INVALID_ARGUMENT for a folder; all usage errors (exit 2).
  auto unreadable = [&](absl::StatusCode code, const std::string& why) {
    absl::Status st(code, absl::StrCat(path, ": ", why));
    st.SetPayload(kSpecUnreadablePayload, absl::Cord("1"));
    return st;
  };
  auto cannot_open = [&](int err) {
    const absl::StatusCode code = err == EACCES || err == EPERM
                                      ? absl::StatusCode::kPermissionDenied
                                      : absl::StatusCode::kNotFound;
    return unreadable(code, absl::StrCat("cannot open the job spec: ", std::strerror(err)));
  };
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return cannot_open(errno);
  // An ifstream opens a folder without complaint and reads nothing from it.
  if (S_ISDIR(st.st_mode)) {
    return unreadable(absl::StatusCode::kInvalidArgument,
                      "is a folder, not a job spec file (give the .json file in it)");
  }
  if (access(path.c_str(), R_OK) != 0) return cannot_open(errno);
  std::ifstream in(path);
  if (!in) return cannot_open(EIO);
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
  absl::StrAppend(&out, "data:         ", DescribeData(spec), "\n");
  if (spec.data.format == DataFormat::kMegatron) {
    absl::StrAppend(&out, "index cache:  ", MegatronCacheDir(spec), "\n");
  }
  if (spec.eval.enabled()) absl::StrAppend(&out, "eval:         ", DescribeEval(spec.eval), "\n");
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
      "Check a job spec as submit would (fields, the files it names) and print the layout, the "
      "data and evaluation, the model's size and memory per rank; submits nothing");
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
