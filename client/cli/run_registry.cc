// The run registry (up.h): which run folder `latchkey up` ran each (coordinator, job id) in, and
// the choice a command makes between the runs of one job id.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/cli/format.h"
#include "client/cli/up.h"
#include "client/credentials.h"
#include "common/job_spec.h"

namespace latchkey::cli {
namespace {

namespace fs = std::filesystem;

constexpr size_t kRunsKept = 200;
constexpr int kRegistryVersion = 2;

std::string Str(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t Int(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

// A record from its JSON object (the first format's entries carry no job id nor address: the
// caller supplies the id); nullopt when it names no run folder.
std::optional<RunRecord> FromJson(const nlohmann::json& j, const std::string& job_id) {
  if (!j.is_object()) return std::nullopt;
  RunRecord r;
  r.job_id = job_id.empty() ? Str(j, "job_id") : job_id;
  r.run_dir = Str(j, "run_dir");
  r.checkpoint_dir = Str(j, "checkpoint_dir");
  r.world = static_cast<int>(Int(j, "world"));
  r.coordinator = Str(j, "coordinator");
  r.recorded_unix_seconds = Int(j, "recorded_unix_seconds");
  r.job_uid = Str(j, "job_uid");
  if (r.job_id.empty() || r.run_dir.empty()) return std::nullopt;
  return r;
}

nlohmann::json ToJson(const RunRecord& r) {
  return {{"coordinator", r.coordinator},
          {"job_id", r.job_id},
          {"run_dir", r.run_dir},
          {"checkpoint_dir", r.checkpoint_dir},
          {"world", r.world},
          {"job_uid", r.job_uid},
          {"recorded_unix_seconds", r.recorded_unix_seconds}};
}

std::vector<RunRecord> RunsOf(const std::string& job_id) {
  std::vector<RunRecord> runs = ReadRuns();
  runs.erase(std::remove_if(runs.begin(), runs.end(),
                            [&](const RunRecord& r) { return r.job_id != job_id; }),
             runs.end());
  return runs;
}

bool SameCoordinator(const RunRecord& r, const std::string& address) {
  return !r.coordinator.empty() && CanonicalAddress(r.coordinator) == CanonicalAddress(address);
}

// "coordinator 127.0.0.1:41234, run folder /x/run, recorded 2024-05-01T10:00:00Z (its up ended)".
std::string Describe(const RunRecord& r) {
  return absl::StrCat("coordinator ", r.coordinator.empty() ? "unknown" : r.coordinator,
                      ", run folder ", r.run_dir, ", recorded ",
                      FormatTimestamp(absl::FromUnixSeconds(r.recorded_unix_seconds)),
                      RunIsLive(r.run_dir) ? " (running)" : " (its up ended)");
}

std::string DescribeAll(const std::vector<RunRecord>& runs) {
  std::vector<std::string> lines;
  for (const RunRecord& r : runs) lines.push_back(Describe(r));
  return absl::StrJoin(lines, "; ");
}

}  // namespace

std::string RunRegistryPath() {
  const char* xdg = std::getenv("XDG_STATE_HOME");
  if (xdg != nullptr && *xdg != 0) return std::string(xdg) + "/latchkey/runs.json";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != 0) return std::string(home) + "/.local/state/latchkey/runs.json";
  return "";
}

std::string CanonicalAddress(const std::string& address) {
  const std::string localhost = "localhost:";
  if (address.rfind(localhost, 0) == 0) return "127.0.0.1:" + address.substr(localhost.size());
  return address;
}

std::vector<RunRecord> ReadRuns() {
  std::vector<RunRecord> runs;
  const std::string path = RunRegistryPath();
  if (path.empty()) return runs;
  const nlohmann::json j = nlohmann::json::parse(ReadTextFile(path), nullptr, false);
  if (!j.is_object()) return runs;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "runs" && it->is_array()) {
      for (const nlohmann::json& e : *it) {
        if (std::optional<RunRecord> r = FromJson(e, ""); r) runs.push_back(*std::move(r));
      }
    } else if (it.key() != "version") {
      // The first format: job id -> {run_dir, checkpoint_dir, world, recorded_unix_seconds}.
      if (std::optional<RunRecord> r = FromJson(*it, it.key()); r) runs.push_back(*std::move(r));
    }
  }
  std::stable_sort(runs.begin(), runs.end(), [](const RunRecord& a, const RunRecord& b) {
    return a.recorded_unix_seconds > b.recorded_unix_seconds;
  });
  return runs;
}

absl::Status RecordRun(const RunRecord& run) {
  const std::string path = RunRegistryPath();
  if (path.empty()) return absl::FailedPreconditionError("neither XDG_STATE_HOME nor HOME is set");
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  RunRecord added = run;
  added.coordinator = CanonicalAddress(run.coordinator);
  added.recorded_unix_seconds = static_cast<int64_t>(std::time(nullptr));
  std::vector<RunRecord> runs = ReadRuns();
  runs.erase(
      std::remove_if(runs.begin(), runs.end(),
                     [&](const RunRecord& r) {
                       return r.job_id == added.job_id &&
                              (SameCoordinator(r, added.coordinator) || r.run_dir == added.run_dir);
                     }),
      runs.end());
  runs.insert(runs.begin(), added);
  if (runs.size() > kRunsKept) runs.resize(kRunsKept);  // the oldest go
  nlohmann::json list = nlohmann::json::array();
  for (const RunRecord& r : runs) list.push_back(ToJson(r));
  const nlohmann::json j = {{"version", kRegistryVersion}, {"runs", list}};
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  if (absl::Status st = WritePrivateFile(tmp, j.dump(2) + "\n"); !st.ok()) return st;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<RunRecord> ResolveRun(const std::string& job_id, const std::string& coordinator,
                                     const std::string& run_dir) {
  std::vector<RunRecord> runs = RunsOf(job_id);
  if (!run_dir.empty()) {
    const std::string dir = fs::absolute(run_dir).lexically_normal().string();
    const std::string folder =
        dir.size() > 1 && dir.back() == '/' ? dir.substr(0, dir.size() - 1) : dir;
    for (const RunRecord& r : runs) {
      if (r.run_dir == folder &&
          (coordinator.empty() || r.coordinator.empty() || SameCoordinator(r, coordinator))) {
        return r;
      }
    }
    // Not recorded (another registry, or a folder moved): what the folder keeps of the job.
    RunRecord r;
    r.job_id = job_id;
    r.run_dir = folder;
    r.coordinator = coordinator;
    const std::string spec_path = JobRecordsDir(folder, job_id) + "/spec.json";
    const std::string text = ReadTextFile(spec_path);
    if (!text.empty()) {
      absl::StatusOr<JobSpec> spec = ParseJobSpec(text, folder);
      if (!spec.ok()) {
        return absl::Status(spec.status().code(),
                            absl::StrCat(spec_path, ": ", spec.status().message()));
      }
      r.world = spec->world_size;
      r.checkpoint_dir = spec->checkpoint.dir;
    }
    return r;
  }
  if (!coordinator.empty()) {
    for (const RunRecord& r : runs) {
      if (SameCoordinator(r, coordinator)) return r;
    }
    return absl::NotFoundError(absl::StrCat(
        "job ", job_id, " at coordinator ", coordinator,
        ": no run of `latchkey up` recorded for it in ", RunRegistryPath(),
        runs.empty() ? std::string()
                     : absl::StrCat(" (it has runs of ", job_id,
                                    " at other coordinators: ", DescribeAll(runs), ")"),
        "; pass --run-dir RUN"));
  }
  // Runs whose folder was deleted are no candidates.
  runs.erase(std::remove_if(runs.begin(), runs.end(),
                            [](const RunRecord& r) { return !fs::is_directory(r.run_dir); }),
             runs.end());
  if (runs.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job_id, ": no run folder known (latchkey up records the jobs it runs in ",
        RunRegistryPath(), "); pass --run-dir RUN"));
  }
  if (runs.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", job_id, ": ", runs.size(),
                     " runs of `latchkey up` have this id (each coordinator numbers its jobs from "
                     "job-000001): ",
                     DescribeAll(runs), "; pass --coordinator ADDR or --run-dir RUN to say which"));
  }
  return runs.front();
}

absl::Status ExplainUnreachableJob(const std::string& job_id, const std::string& coordinator,
                                   const absl::Status& unreachable) {
  std::vector<RunRecord> runs = RunsOf(job_id);
  if (!coordinator.empty()) {
    runs.erase(std::remove_if(runs.begin(), runs.end(),
                              [&](const RunRecord& r) { return !SameCoordinator(r, coordinator); }),
               runs.end());
  }
  std::vector<RunRecord> live, ended;
  for (const RunRecord& r : runs) (RunIsLive(r.run_dir) ? live : ended).push_back(r);
  if (!live.empty()) {
    // Its `up` runs: its coordinator is somewhere else, or starting again.
    if (!coordinator.empty()) return unreachable;
    std::vector<std::string> where;
    for (const RunRecord& r : live) {
      where.push_back(
          absl::StrCat("--coordinator ", r.coordinator, " (run folder ", r.run_dir, ")"));
    }
    return absl::Status(unreachable.code(), absl::StrCat(unreachable.message(), "; job ", job_id,
                                                         " runs under a live `latchkey up`: pass ",
                                                         absl::StrJoin(where, " or ")));
  }
  if (ended.empty()) return unreachable;
  std::vector<std::string> said;
  for (const RunRecord& r : ended) {
    said.push_back(absl::StrCat(
        "job ", job_id, " ran under `latchkey up` in ", r.run_dir, " (coordinator ",
        r.coordinator.empty() ? "unknown" : r.coordinator, ", recorded ",
        FormatTimestamp(absl::FromUnixSeconds(r.recorded_unix_seconds)),
        "); that up has ended and its coordinator with it: its records are in the run folder "
        "(`latchkey logs ",
        job_id, " --run-dir ", r.run_dir, "`, `latchkey checkpoints ", job_id, " --run-dir ",
        r.run_dir, "`) and its final state in the database ", r.run_dir, "/coordinator.db"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(unreachable.message(), "; ", absl::StrJoin(said, "; ")));
}

}  // namespace latchkey::cli
