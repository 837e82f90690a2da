// `latchkey up`'s first phase: the spec, the run folder, the admin token, the certificates.
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "client/cli/builtin_spec.h"
#include "client/cli/up.h"
#include "client/credentials.h"
#include "common/job_spec.h"
#include "common/spec_files.h"

namespace latchkey::cli {
namespace {

namespace fs = std::filesystem;

// The spec with latchkey.max_restarts set (text that is not a JSON object is left to the
// spec's own validation).
std::string WithMaxRestarts(const std::string& text, int max_restarts) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return text;
  if (!j.contains("latchkey") || !j["latchkey"].is_object())
    j["latchkey"] = nlohmann::json::object();
  j["latchkey"]["max_restarts"] = max_restarts;
  return j.dump(2) + "\n";
}

// The spec with latchkey.tensorboard.dir set (an absolute path).
std::string WithTensorboardDir(const std::string& text, const std::string& dir) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return text;
  if (!j.contains("latchkey") || !j["latchkey"].is_object())
    j["latchkey"] = nlohmann::json::object();
  j["latchkey"]["tensorboard"] = {{"dir", dir}};
  return j.dump(2) + "\n";
}

// Another live run (in the run registry) whose job checkpoints into `dir`: its job id, or "".
std::string LiveRunSharing(const std::string& dir, const std::string& own_run_dir) {
  for (const RunRecord& r : ReadRuns()) {
    if (r.checkpoint_dir == dir && r.run_dir != own_run_dir && RunIsLive(r.run_dir)) {
      return r.job_id;
    }
  }
  return "";
}

// A Megatron dataset whose folder this user cannot write, with no latchkey.data.cache_dir:
// the index cache goes to RUN/index-cache (the workers' own fallback would be the checkpoint
// folder or the system's temporary folder). The spec text and the parsed spec both get it.
void DefaultIndexCacheDir(const std::string& run_dir, std::string* text, JobSpec* spec) {
  if (spec->data.format != DataFormat::kMegatron || !spec->data.cache_dir.empty()) return;
  const std::string& first =
      spec->data.blend.empty() ? spec->data.path_prefix : spec->data.blend[0].path_prefix;
  const std::string folder = fs::path(first).parent_path().string();
  if (::access(folder.c_str(), W_OK | X_OK) == 0) return;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j["latchkey"].is_object() || !j["latchkey"]["data"].is_object()) return;
  spec->data.cache_dir = run_dir + "/index-cache";
  j["latchkey"]["data"]["cache_dir"] = spec->data.cache_dir;
  *text = j.dump(2) + "\n";
}

}  // namespace

absl::StatusOr<PreparedRun> Prepare(const UpOptions& o) {
  PreparedRun run;
  run.built_in = o.spec.empty();
  std::string spec_dir = fs::current_path().string();
  if (run.built_in) {
    run.spec_text = std::string(kBuiltInJobSpec);
  } else {
    // What submit checks: the file (not a folder), its fields, and the files it names.
    absl::StatusOr<JobSpec> read =
        LoadSpecForSubmit(o.spec, /*check_files=*/false, &run.spec_text, &spec_dir);
    if (!read.ok()) return WithPrefix("--spec ", read.status());  // kept: a usage error's mark
  }
  if (o.max_restarts >= 0) run.spec_text = WithMaxRestarts(run.spec_text, o.max_restarts);
  // The built-in spec names no files; a spec file's relative paths resolve against its folder.
  absl::StatusOr<JobSpec> spec = ParseJobSpec(run.spec_text, spec_dir);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        (run.built_in ? std::string() : "--spec " + o.spec + ": ") +
                            std::string(spec.status().message()));
  }
  if (!o.no_file_check) {
    if (absl::Status files = CheckSpecFiles(*spec); !files.ok()) {
      return absl::Status(files.code(), "--spec " + o.spec + ": " + std::string(files.message()) +
                                            " (--no-file-check to start anyway)");
    }
  }
  // One worker per rank: fewer would leave the job pending for ever, more would be refused one
  // by one and restarted.
  if (o.workers > 0 && o.workers != spec->world_size) {
    return absl::InvalidArgumentError("--workers " + std::to_string(o.workers) +
                                      ": the spec's world size (latchkey.world_size) is " +
                                      std::to_string(spec->world_size) +
                                      "; up starts one worker per rank: pass --workers " +
                                      std::to_string(spec->world_size) + " or leave it out");
  }
  run.world = spec->world_size;
  run.checkpoint_dir = spec->checkpoint.dir;
  run.dir = AbsoluteFolder(o.run_dir.empty() ? "runs/up-" + std::to_string(std::time(nullptr))
                                             : o.run_dir);
  run.base_dir = run.built_in ? run.dir : spec_dir;
  DefaultIndexCacheDir(run.dir, &run.spec_text, &*spec);
  // latchkey.tensorboard defaults to RUN/tensorboard.
  if (!spec->tensorboard.enabled()) {
    spec->tensorboard.dir = run.dir + "/tensorboard";
    run.spec_text = WithTensorboardDir(run.spec_text, spec->tensorboard.dir);
  }
  run.tensorboard_dir = spec->tensorboard.dir;
  std::error_code mkdir_error;
  fs::create_directories(run.dir, mkdir_error);
  if (mkdir_error) {
    return absl::PermissionDeniedError("--run-dir: cannot create '" + run.dir +
                                       "': " + mkdir_error.message());
  }
  // Before anything in the folder is touched: a live run's files stay its own.
  absl::StatusOr<int> lock = AcquireRunLock(run.dir);
  if (!lock.ok()) return lock.status();
  run.lock_fd = *lock;
  if (!run.checkpoint_dir.empty()) {
    if (const std::string other = LiveRunSharing(run.checkpoint_dir, run.dir); !other.empty()) {
      std::fprintf(stderr,
                   "latchkey up: warning: job %s, still running, checkpoints into %s too: the two "
                   "jobs will resume from each other's checkpoints only if they are the same job\n",
                   other.c_str(), run.checkpoint_dir.c_str());
    }
    if (const std::string w = OtherJobsCheckpointsWarning(*spec); !w.empty()) {
      std::fprintf(stderr, "latchkey up: warning: %s\n", w.c_str());
    }
  }
  // The last job's records stay in RUN/jobs/; the top level will point at this job's.
  SetAsidePreviousRecords(run.dir);
  // The spec as submitted, kept with the run (canonical: absolute paths).
  std::ofstream(run.dir + "/spec.json") << (run.built_in ? run.spec_text : JobSpecToJson(*spec));
  if (run.built_in) {
    // The demo's layers, not its model: the vocabulary is the synthetic source's.
    std::printf(
        "spec         built-in job (the demo's layers with a %lld-token vocabulary, "
        "synthetic data, %lld steps; %s/spec.json, or pass --spec FILE)\n",
        static_cast<long long>(spec->model.vocab_size), static_cast<long long>(spec->steps),
        run.dir.c_str());
  }

  // The admin token of this run's coordinator: only its hash goes into --auth-tokens.
  const absl::StatusOr<std::string> admin_token = RandomHexToken(32);
  if (!admin_token.ok()) return admin_token.status();
  run.token = *admin_token;
  if (absl::Status st = WritePrivateFile(
          run.dir + "/auth-tokens",
          "# written by latchkey up: ROLE NAME SHA256HEX\nadmin up " + Sha256Hex(run.token) + "\n");
      !st.ok()) {
    return st;
  }
  // A run folder can be reused (the database keeps earlier jobs): never read a stale port file.
  fs::remove(run.dir + "/ports.json");
  for (int r = 0; r < run.world; ++r) {
    fs::remove(run.dir + "/worker-" + std::to_string(r) + ".port.json");
  }
  // Each job's curves start afresh in up's default event folder, as its JSONL does.
  if (spec->tensorboard.dir == run.dir + "/tensorboard") {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(spec->tensorboard.dir, ec)) {
      if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) fs::remove(e.path());
    }
  }
  run.tls_dir = run.dir + "/tls";
  if (o.tls) {
    if (absl::Status st = MakeLocalCertificates(run.tls_dir); !st.ok()) return st;
    run.tls_ca = run.tls_dir + "/ca.pem";
  }
  return run;
}

}  // namespace latchkey::cli
