// `latchkey logs JOB [--rank R] [-f]` and `latchkey checkpoints JOB`: what a job run by `up` left
// in its run folder (each rank's log RUN/worker-R.log) and in its checkpoint folder, found
// through the run registry `up` writes (up.h); also the run registry and the run folder's lock.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/cli.h"
#include "client/cli/format.h"
#include "client/cli/up.h"
#include "client/credentials.h"
#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey::cli {
namespace {

namespace fs = std::filesystem;

constexpr size_t kRunsKept = 200;

nlohmann::json ReadRegistry() {
  const std::string path = RunRegistryPath();
  if (path.empty()) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(ReadTextFile(path), nullptr, false);
  return j.is_object() ? j : nlohmann::json::object();
}

// The run folder of `job_id`: --run-dir when given, else the registry's; NOT_FOUND otherwise.
absl::StatusOr<RunRecord> RunOf(const std::string& job_id, const std::string& run_dir) {
  if (!run_dir.empty()) {
    RunRecord r;
    r.job_id = job_id;
    r.run_dir = fs::absolute(run_dir).string();
    if (std::optional<RunRecord> known = FindRun(job_id); known && known->run_dir == r.run_dir) {
      return *known;
    }
    return r;
  }
  std::optional<RunRecord> known = FindRun(job_id);
  if (!known) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job_id, ": no run folder known (latchkey up records the jobs it runs in ",
        RunRegistryPath(), "); pass --run-dir RUN"));
  }
  return *known;
}

// Rank r's log, RUN/worker-r.log.
std::string LogPath(const std::string& run_dir, int r) {
  return absl::StrCat(run_dir, "/worker-", r, ".log");
}

// Prints what `in` has beyond what was read, each line prefixed; keeps a partial last line for
// the next call.
void PrintNew(std::ifstream& in, const std::string& prefix, std::string* partial) {
  if (!in.is_open()) return;
  in.clear();
  std::string chunk((std::istreambuf_iterator<char>(in)), {});
  *partial += chunk;
  size_t start = 0;
  for (size_t nl; (nl = partial->find('\n', start)) != std::string::npos; start = nl + 1) {
    std::cout << prefix << partial->substr(start, nl - start + 1);
  }
  partial->erase(0, start);
  std::cout.flush();
}

}  // namespace

std::string RunRegistryPath() {
  const char* xdg = std::getenv("XDG_STATE_HOME");
  if (xdg != nullptr && *xdg != 0) return std::string(xdg) + "/latchkey/runs.json";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != 0) return std::string(home) + "/.local/state/latchkey/runs.json";
  return "";
}

absl::Status RecordRun(const RunRecord& run) {
  const std::string path = RunRegistryPath();
  if (path.empty()) return absl::FailedPreconditionError("neither XDG_STATE_HOME nor HOME is set");
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  nlohmann::json j = ReadRegistry();
  j[run.job_id] = {{"run_dir", run.run_dir},
                   {"checkpoint_dir", run.checkpoint_dir},
                   {"world", run.world},
                   {"recorded_unix_seconds", static_cast<int64_t>(std::time(nullptr))}};
  if (!run.job_uid.empty()) j[run.job_id]["job_uid"] = run.job_uid;
  // The oldest entries go once there are too many.
  while (j.size() > kRunsKept) {
    auto oldest = j.begin();
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it->value("recorded_unix_seconds", int64_t{0}) <
          oldest->value("recorded_unix_seconds", int64_t{0})) {
        oldest = it;
      }
    }
    j.erase(oldest);
  }
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  if (absl::Status st = WritePrivateFile(tmp, j.dump(2) + "\n"); !st.ok()) return st;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::optional<RunRecord> FindRun(const std::string& job_id) {
  const nlohmann::json j = ReadRegistry();
  auto it = j.find(job_id);
  if (it == j.end() || !it->is_object()) return std::nullopt;
  RunRecord r;
  r.job_id = job_id;
  r.run_dir = it->value("run_dir", std::string());
  r.checkpoint_dir = it->value("checkpoint_dir", std::string());
  r.world = it->value("world", 0);
  r.job_uid = it->value("job_uid", std::string());
  if (r.run_dir.empty()) return std::nullopt;
  return r;
}

absl::StatusOr<int> AcquireRunLock(const std::string& run_dir) {
  const std::string path = run_dir + "/up.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("--run-dir: cannot open ", path, ": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const std::string holder = ReadTextFile(path);
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("--run-dir ", run_dir, ": another latchkey up is running in it (pid ",
                     holder.empty() ? std::string("?") : holder.substr(0, holder.find('\n')),
                     "); give another --run-dir, or wait for it to end"));
  }
  if (ftruncate(fd, 0) == 0) {
    const std::string pid = std::to_string(getpid()) + "\n";
    (void)!write(fd, pid.data(), pid.size());
  }
  return fd;
}

bool RunIsLive(const std::string& run_dir) {
  const int fd = open((run_dir + "/up.lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);
  return held;
}

void AddLogsCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  struct Args {
    std::string job_id;
    int rank = -1;
    bool follow = false;
    std::string run_dir;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "logs",
      "Print the workers' logs of a job run by `latchkey up` (RUN/worker-R.log: start, per-step "
      "lines, recoveries, errors)");
  sub->add_option("job", args->job_id, "job id")->required();
  sub->add_option("--rank", args->rank, "only this rank's log (default: every rank's)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("-f,--follow", args->follow,
                "keep printing what the logs get until the run's `up` ends (or Ctrl-C)");
  sub->add_option("--run-dir", args->run_dir, "the run folder (default: the one up recorded)");
  sub->callback([args, &ctx, exit_code] {
    (void)ctx;
    absl::StatusOr<RunRecord> run = RunOf(args->job_id, args->run_dir);
    if (!run.ok()) {
      *exit_code = Fail(run.status());
      return;
    }
    std::vector<int> ranks;
    if (args->rank >= 0) {
      ranks.push_back(args->rank);
    } else {
      for (int r = 0; fs::exists(LogPath(run->run_dir, r)) || r < run->world; ++r) {
        ranks.push_back(r);
      }
    }
    for (int r : ranks) {
      if (!fs::exists(LogPath(run->run_dir, r))) {
        *exit_code = Fail(absl::NotFoundError(absl::StrCat(
            "job ", args->job_id, ": rank ", r, " has no log ", LogPath(run->run_dir, r))));
        return;
      }
    }
    struct Log {
      std::ifstream in;
      std::string prefix;
      std::string partial;
    };
    std::vector<Log> logs(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) {
      logs[i].in.open(LogPath(run->run_dir, ranks[i]));
      logs[i].prefix = ranks.size() > 1 ? absl::StrCat("[rank ", ranks[i], "] ") : "";
    }
    while (true) {
      // Whether the run is still live is asked before the read: what it writes before ending
      // is then read once more.
      const bool live = args->follow && RunIsLive(run->run_dir);
      for (Log& l : logs) PrintNew(l.in, l.prefix, &l.partial);
      if (!live) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    for (Log& l : logs) {
      if (!l.partial.empty()) std::cout << l.prefix << l.partial << "\n";
    }
    *exit_code = kOk;
  });
}

void AddCheckpointsCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  struct Args {
    std::string job_id;
    std::string run_dir;
    std::string dir;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "checkpoints",
      "List a job's committed checkpoints (those carrying its job uid): step, size, when, the "
      "layout that wrote it");
  sub->add_option("job", args->job_id, "job id")->required();
  sub->add_option("--run-dir", args->run_dir, "the run folder `up` used (default: recorded)");
  sub->add_option("--dir", args->dir,
                  "the checkpoint folder (default: the job's latchkey.checkpoint.dir, from the "
                  "run `up` recorded, else from the coordinator)");
  sub->callback([args, &ctx, exit_code] {
    // The folder, and the job's uid: from the run `up` recorded, else from the coordinator.
    std::string root = args->dir;
    CheckpointOwner owner(args->job_id);
    const absl::StatusOr<RunRecord> run = RunOf(args->job_id, args->run_dir);
    // A run `up` recorded: never asked of a coordinator, whose job of the same id (ids repeat
    // across coordinators) may be another job.
    const bool from_run = run.ok() && (!run->checkpoint_dir.empty() || !run->job_uid.empty());
    if (from_run) {
      owner.job_uid = run->job_uid;
      if (root.empty()) root = run->checkpoint_dir;
    }
    if (run.ok() && root.empty()) {
      *exit_code = Fail(absl::NotFoundError(
          absl::StrCat("job ", args->job_id, ": its spec has no latchkey.checkpoint")));
      return;
    }
    if (!from_run) {
      // Not a job `up` ran: its coordinator knows its spec and uid. With --dir the folder is
      // known: a coordinator that cannot answer only leaves the uid unknown.
      JobClient client(ctx.client_options());
      absl::StatusOr<JobInfo> job = client.GetJob(args->job_id);
      if (!job.ok() && root.empty()) {
        *exit_code = Fail(job.status());
        return;
      }
      if (job.ok()) {
        owner.job_uid = job->job_uid;
        if (root.empty()) {
          absl::StatusOr<JobSpec> spec = ParseJobSpec(job->spec_json, job->base_dir);
          if (!spec.ok()) {
            *exit_code = Fail(spec.status());
            return;
          }
          if (!spec->checkpoint.enabled()) {
            *exit_code = Fail(absl::NotFoundError(
                absl::StrCat("job ", args->job_id, ": its spec has no latchkey.checkpoint")));
            return;
          }
          root = spec->checkpoint.dir;
        }
      }
    }
    if (owner.job_uid.empty() && !ctx.json) {  // --json: its job_uid "" says it
      // Job ids repeat across coordinators: without the uid, every job of this id is listed.
      std::cerr << "latchkey: job " << args->job_id
                << ": its job uid is unknown here: listing the checkpoints of every job with this "
                   "id in "
                << root << "\n";
    }
    absl::StatusOr<std::vector<FoundCheckpoint>> listed = ListCheckpoints(root, owner);
    if (!listed.ok()) {
      *exit_code = Fail(listed.status());
      return;
    }
    std::vector<std::pair<std::string, CheckpointManifest>> found;
    for (FoundCheckpoint& c : *listed) found.emplace_back(c.dir, std::move(c.manifest));
    // A folder that does not exist yet (made at the first checkpoint) lists nothing.
    std::sort(found.begin(), found.end(),
              [](const auto& a, const auto& b) { return a.second.step < b.second.step; });
    nlohmann::json list = nlohmann::json::array();
    if (!ctx.json) {
      std::cout << absl::StrFormat("%-8s %-12s %-20s %-7s %-26s %s\n", "STEP", "SIZE", "WHEN",
                                   "ATTEMPT", "LAYOUT", "FOLDER");
    }
    for (const auto& [dir, m] : found) {
      int64_t bytes = 0;
      for (const CheckpointFileEntry& f : m.files) bytes += f.bytes;
      const std::string layout = absl::StrCat("world ", m.world_size, " (tp ", m.tp, " x dp ", m.dp,
                                              ") zero ", m.zero_stage, m.bf16 ? " bf16" : "");
      if (ctx.json) {
        list.push_back({{"step", m.step},
                        {"bytes", bytes},
                        {"created_unix_seconds", m.created_unix_seconds},
                        {"attempt", m.attempt},
                        {"world_size", m.world_size},
                        {"tp", m.tp},
                        {"dp", m.dp},
                        {"zero_stage", m.zero_stage},
                        {"bf16", m.bf16},
                        {"job_uid", m.job_uid},
                        {"dir", dir}});
      } else {
        std::cout << absl::StrFormat("%-8d %-12d %-20s %-7d %-26s %s\n", m.step, bytes,
                                     FormatTimestamp(absl::FromUnixSeconds(m.created_unix_seconds)),
                                     m.attempt, layout, dir);
      }
    }
    if (ctx.json) {
      std::cout << nlohmann::json{{"job_id", args->job_id},
                                  {"job_uid", owner.job_uid},
                                  {"dir", root},
                                  {"checkpoints", list}}
                       .dump()
                << "\n";
    }
    *exit_code = kOk;
  });
}

}  // namespace latchkey::cli
