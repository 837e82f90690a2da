// `latchkey logs JOB [--rank R] [-f]`, `latchkey checkpoints JOB` and `latchkey trace JOB`: what a
// job run by `up` left in its run folder (each rank's log RUN/jobs/JOB/worker-R.log and trace
// RUN/jobs/JOB/trace-R.jsonl) and in its checkpoint folder, found through the run registry `up`
// writes (up.h, run_registry.cc); `trace --run-dir D` also reads a node agent's folder.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"
#include "client/cli/format.h"
#include "client/cli/up.h"
#include "client/trace_file.h"
#include "worker/checkpoint/train_checkpoint.h"

namespace latchkey::cli {
namespace {

namespace fs = std::filesystem;

// Rank r's log of the job whose records are in `records` (RUN/jobs/JOB).
std::string LogPath(const std::string& records, int r) {
  return absl::StrCat(records, "/worker-", r, ".log");
}

// The address a command was pointed at explicitly (--coordinator, $LATCHKEY_COORDINATOR), else
// "": the registry's runs of the job id are then all candidates.
std::string ExplicitCoordinator(const CliContext& ctx) {
  return ctx.coordinator_given ? ctx.coordinator : std::string();
}

// Whether the job's `up` still runs: its folder's `up` is live and the job is the folder's newest
// (the top-level log links to it).
bool JobIsLive(const RunRecord& run) {
  if (!RunIsLive(run.run_dir)) return false;
  const std::string top = run.run_dir + "/worker-0.log";
  std::error_code ec;
  if (fs::is_regular_file(fs::symlink_status(top, ec))) return true;  // the older layout
  const std::string target = fs::read_symlink(top, ec).string();
  return !ec && target.rfind("jobs/" + run.job_id + "/", 0) == 0;
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
      "Print the workers' logs of a job run by `latchkey up` (RUN/jobs/JOB/worker-R.log: start, "
      "per-step lines, recoveries, errors)");
  sub->add_option("job", args->job_id, "job id")->required();
  sub->add_option("--rank", args->rank, "only this rank's log (default: every rank's)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("-f,--follow", args->follow,
                "keep printing what the logs get until the run's `up` ends (or Ctrl-C)");
  sub->add_option("--run-dir", args->run_dir,
                  "the run folder (default: the one up recorded for the job at --coordinator, or "
                  "the only one recorded for the job id)");
  sub->callback([args, &ctx, exit_code] {
    absl::StatusOr<RunRecord> run =
        ResolveRun(args->job_id, ExplicitCoordinator(ctx), args->run_dir);
    if (!run.ok()) {
      *exit_code = Fail(run.status());
      return;
    }
    const absl::StatusOr<std::string> records = FindJobRecords(*run);
    if (!records.ok()) {
      *exit_code = Fail(records.status());
      return;
    }
    std::vector<int> ranks;
    if (args->rank >= 0) {
      ranks.push_back(args->rank);
    } else {
      for (int r = 0; fs::exists(LogPath(*records, r)) || r < run->world; ++r) {
        ranks.push_back(r);
      }
    }
    for (int r : ranks) {
      if (!fs::exists(LogPath(*records, r))) {
        *exit_code = Fail(absl::NotFoundError(absl::StrCat("job ", args->job_id, ": rank ", r,
                                                           " has no log ", LogPath(*records, r))));
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
      logs[i].in.open(LogPath(*records, ranks[i]));
      logs[i].prefix = ranks.size() > 1 ? absl::StrCat("[rank ", ranks[i], "] ") : "";
    }
    while (true) {
      // Whether the run is still live is asked before the read: what it writes before ending
      // is then read once more.
      const bool live = args->follow && JobIsLive(*run);
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
  sub->add_option("--run-dir", args->run_dir,
                  "the run folder `up` used (default: the one up recorded for the job at "
                  "--coordinator, or the only one recorded for the job id)");
  sub->add_option("--dir", args->dir,
                  "the checkpoint folder (default: the job's latchkey.checkpoint.dir, from the "
                  "run `up` recorded, else from the coordinator)");
  sub->callback([args, &ctx, exit_code] {
    // The folder, and the job's uid: from the run `up` recorded, else from the coordinator.
    std::string root = args->dir;
    CheckpointOwner owner(args->job_id);
    absl::StatusOr<RunRecord> run =
        ResolveRun(args->job_id, ExplicitCoordinator(ctx), args->run_dir);
    // A run folder named, or several runs of the id: that run or nothing.
    if (run.ok() && !args->run_dir.empty()) {
      if (absl::StatusOr<std::string> records = FindJobRecords(*run); !records.ok()) {
        *exit_code = Fail(records.status());
        return;
      }
    }
    if (!run.ok() && (!args->run_dir.empty() || !absl::IsNotFound(run.status()))) {
      *exit_code = Fail(run.status());
      return;
    }
    // A run `up` recorded: never asked of a coordinator, whose job of the same id (ids repeat
    // across coordinators) may be another job.
    if (run.ok()) {
      owner.job_uid = run->job_uid;
      if (root.empty()) root = run->checkpoint_dir;
      if (root.empty()) {
        *exit_code = Fail(absl::NotFoundError(
            absl::StrCat("job ", args->job_id, ": its spec has no latchkey.checkpoint")));
        return;
      }
    } else {
      // Not a job `up` ran (or not at this coordinator): its coordinator knows its spec and uid.
      // With --dir the folder is known: a coordinator that cannot answer only leaves the uid
      // unknown.
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

namespace {

// The ranks' answers to GetTrace, parsed; the ranks that did not answer are said on stderr.
absl::StatusOr<std::vector<RankTrace>> ParseLiveTrace(const JobClient::TraceLines& live,
                                                      const std::string& job_id) {
  std::vector<RankTrace> out;
  for (const auto& [rank, jsonl] : live.ranks) {
    absl::StatusOr<RankTrace> t = ParseRankTrace(jsonl, absl::StrCat("rank ", rank, "'s answer"));
    if (!t.ok()) return t.status();
    out.push_back(*std::move(t));
  }
  auto ranks = [](const std::vector<int>& v) { return absl::StrJoin(v, ", "); };
  if (!live.missing.empty()) {
    std::cerr << "latchkey: job " << job_id << ": ranks " << ranks(live.missing)
              << " did not answer in time (--wait): the trace has the others" << std::endl;
  }
  if (!live.omitted.empty()) {
    std::cerr << "latchkey: job " << job_id << ": ranks " << ranks(live.omitted)
              << " left out (the answer's 64 MiB cap): narrow --steps" << std::endl;
  }
  if (out.empty()) {
    return absl::UnavailableError(absl::StrCat("job ", job_id, ": no rank answered"));
  }
  return out;
}

// Where `latchkey trace` reads: with --run-dir, the trace-R.jsonl in it (a node agent's folder)
// or in the job's records of that `up` run folder. Otherwise the running job's ranks through its
// coordinator (the explicit one, else the one of the job's live `up` run, else the default),
// and when the job is not running there (or no coordinator answers) the files of the run the
// registry knows for the job.
absl::StatusOr<std::vector<RankTrace>> CollectTrace(const CliContext& ctx,
                                                    const std::string& job_id,
                                                    const StepRange& steps,
                                                    const std::string& run_dir, int wait_s) {
  auto from_records = [&](const absl::StatusOr<RunRecord>& run) {
    absl::StatusOr<std::string> records =
        run.ok() ? FindJobRecords(*run) : absl::StatusOr<std::string>(run.status());
    if (!records.ok()) return absl::StatusOr<std::vector<RankTrace>>(records.status());
    return ReadRankTraces(*records);
  };
  if (!run_dir.empty()) {
    absl::StatusOr<std::vector<RankTrace>> direct = ReadRankTraces(run_dir);
    if (!absl::IsNotFound(direct.status())) return direct;
    return from_records(ResolveRun(job_id, ExplicitCoordinator(ctx), run_dir));
  }
  const absl::StatusOr<RunRecord> run = ResolveRun(job_id, ExplicitCoordinator(ctx), "");
  CliContext at = ctx;
  if (!ctx.coordinator_given && run.ok() && !run->coordinator.empty()) {
    if (!RunIsLive(run->run_dir)) return from_records(run);  // its coordinator ended with it
    at.coordinator = run->coordinator;  // and the credentials file's entry for it
  }
  const ClientOptions options = at.client_options();
  JobClient client(options);
  absl::StatusOr<JobClient::TraceLines> live = client.GetTrace(
      job_id, steps.first, steps.last == std::numeric_limits<int64_t>::max() ? -1 : steps.last,
      absl::Seconds(wait_s));
  if (live.ok()) return ParseLiveTrace(*live, job_id);
  const absl::StatusCode code = live.status().code();
  if (code != absl::StatusCode::kFailedPrecondition && code != absl::StatusCode::kNotFound &&
      code != absl::StatusCode::kUnavailable) {
    return live.status();
  }
  absl::StatusOr<std::vector<RankTrace>> files = from_records(run);
  if (files.ok()) return files;
  return absl::Status(files.status().code(),
                      absl::StrCat(files.status().message(), "; and the coordinator at ",
                                   options.coordinator, ": ", live.status().message()));
}

}  // namespace

void AddTraceCommand(CLI::App& app, const CliContext& ctx, int* exit_code) {
  struct Args {
    std::string job_id;
    std::string steps;
    std::string out;
    std::string run_dir;
    int wait_s = 10;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand(
      "trace",
      "Write the job's timeline as one Chrome Trace Event file (Perfetto, chrome://tracing, "
      "HolisticTraceAnalysis): a process per rank, a thread per stream (train, collectives, "
      "checkpoint); a running job's ranks answer through the coordinator, an ended job's spans "
      "are read from the trace-R.jsonl its ranks wrote as they ended");
  sub->add_option("job", args->job_id, "job id")->required();
  sub->add_option("--steps", args->steps, "only these steps: A..B, A.. or A (from 0)");
  sub->add_option("-o,--output", args->out, "the file to write (default JOB.trace.json)");
  sub->add_option("--run-dir", args->run_dir,
                  "read the ranks' trace-R.jsonl from this folder (a node agent's --run-dir, or "
                  "an `up` run folder) instead of asking the running job's ranks through the "
                  "coordinator (an ended job: the folder up recorded for it)");
  sub->add_option("--wait", args->wait_s,
                  "how long the coordinator waits for the ranks' answers, seconds")
      ->check(CLI::Range(1, 120))
      ->capture_default_str();
  sub->callback([args, &ctx, exit_code] {
    StepRange steps;
    if (!args->steps.empty()) {
      absl::StatusOr<StepRange> r = ParseStepRange(args->steps);
      if (!r.ok()) {
        *exit_code = Fail(r.status());
        return;
      }
      steps = *r;
    }
    absl::StatusOr<std::vector<RankTrace>> ranks =
        CollectTrace(ctx, args->job_id, steps, args->run_dir, args->wait_s);
    if (!ranks.ok()) {
      *exit_code = Fail(ranks.status());
      return;
    }
    const std::string path = args->out.empty() ? args->job_id + ".trace.json" : args->out;
    std::ofstream f(path, std::ios::trunc);
    if (!f) {
      *exit_code = Fail(absl::InvalidArgumentError("-o " + path + ": cannot write"));
      return;
    }
    absl::StatusOr<TraceSummary> sum = WriteChromeTrace(*ranks, steps, args->job_id, f);
    f.close();
    if (!sum.ok() || !f) {
      std::error_code rm;
      fs::remove(path, rm);
      *exit_code =
          Fail(sum.ok() ? absl::InternalError("-o " + path + ": write failed") : sum.status());
      return;
    }
    const std::string clock =
        sum->clock_error_us >= 0
            ? absl::StrCat("the coordinator's clock, within ", sum->clock_error_us, " us")
            : std::string("a rank had no coordinator clock (its host's clock)");
    if (ctx.json) {
      nlohmann::json j = {{"file", path},
                          {"ranks", sum->ranks},
                          {"events", sum->events},
                          {"first_step", sum->first_step},
                          {"last_step", sum->last_step},
                          {"clock_error_us", sum->clock_error_us},
                          {"dropped", sum->dropped}};
      std::cout << j.dump(2) << std::endl;
    } else {
      std::cout << "wrote " << path << ": " << sum->events << " spans of " << sum->ranks
                << " ranks, steps " << sum->first_step << ".." << sum->last_step << ", on " << clock
                << (sum->dropped > 0 ? absl::StrCat("; ", sum->dropped,
                                                    " older spans were dropped (full "
                                                    "rings: --trace-spans)")
                                     : std::string())
                << std::endl;
    }
    *exit_code = kOk;
  });
}

}  // namespace latchkey::cli
