// What one rank emits while it trains, whoever drives it (standalone or the coordinator):
// the per-step JSONL file, the Prometheus endpoint, and progress lines on stderr (rank 0). Opened
// once per process: a rank that runs several attempts keeps its endpoint and appends to its
// JSONL (a re-run step gets a second record; the last record of a step counts). A fresh run
// (its first attempt is attempt 1 with no checkpoint to resume) starts its JSONL afresh.
#ifndef LATCHKEY_WORKER_RUNNER_RANK_OUTPUTS_H_
#define LATCHKEY_WORKER_RUNNER_RANK_OUTPUTS_H_

#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/latch.h"
#include "worker/checkpoint/train_checkpoint.h"
#include "worker/comm/collective_stats.h"
#include "worker/tensorboard/event_writer.h"
#include "worker/train/engine.h"

namespace latchkey {

struct OutputOptions {
  // "{rank}" replaced by the rank; empty = none. Opened for appending, so a restarted or resumed
  // rank adds to what an earlier process of the same rank wrote; truncated instead when
  // fresh_jsonl is set (a fresh run: earlier runs' records would mix with its own).
  std::string metrics_jsonl;
  bool fresh_jsonl = false;
  // The rank's trace (docs/observability.md "Traces"): its timeline's spans as JSON lines,
  // written when the process's run ends, a header line first; appended (a restarted rank adds
  // its own), truncated with fresh_jsonl. "{rank}" replaced by the rank; empty = none.
  std::string trace_jsonl;
  // The timeline's ring, in spans (0: no timeline, nothing traced).
  int64_t trace_spans = 1 << 16;
  // Prometheus endpoint (builds with metrics only): port -1 = off, 0 = pick a free one.
  std::string metrics_host = "0.0.0.0";
  int metrics_port = -1;
  double linger_seconds = 0;  // keep serving metrics this long after the last step
  // Written (atomically) once the rank has formed its groups and serves its metrics:
  // {"rank": R, "pid": P, "metrics_host": H, "metrics_port": N (-1: none)}. "{rank}" replaced
  // by the rank; empty = none. Launchers wait for it instead of reading logs.
  std::string port_file;
  bool quiet = false;
  // --log-steps: every rank writes its per-step line ("rank R step S/N loss ...") and its
  // checkpoint lines to stderr, --quiet or not (`latchkey up`: each rank's log in the run folder).
  bool log_steps = false;
};

class RankOutputs {
 public:
  // Opens the JSONL file, starts the endpoint (printing "rank R metrics: http://H:P/metrics"
  // on stderr) and writes the port file. `stats` must outlive this object; its listener is set here
  // and cleared in the destructor.
  static absl::StatusOr<std::unique_ptr<RankOutputs>> Open(const OutputOptions& options, int rank,
                                                           comm::CollectiveStats* stats);
  ~RankOutputs();

  // An attempt starts with this process as rank `rank` at window `first_step`: rank 0 of a job
  // with latchkey.tensorboard opens a new event file there (event_writer.h); any other rank
  // closes the one it had. Errors name latchkey.tensorboard.dir.
  absl::Status BeginAttempt(const JobSpec& spec, int rank, int64_t first_step);

  void OnStep(const JobSpec& spec, const Latch& latch, const StepReport& report,
              double latch_wait_seconds);
  // A resumable checkpoint was committed (metrics: its blocked time, bytes and commit time, and
  // for an asynchronous save `background_seconds`, from its staging to its commit).
  void OnCheckpoint(const CheckpointCommit& commit,
                    std::optional<double> background_seconds = std::nullopt);
  // After the last step: serves metrics for linger_seconds more.
  void Linger();

 private:
  RankOutputs() = default;
  OutputOptions options_;
  int rank_ = 0;
  comm::CollectiveStats* stats_ = nullptr;
  std::ofstream jsonl_;
  std::unique_ptr<tensorboard::EventFileWriter> events_;  // rank 0 with latchkey.tensorboard
  // The Prometheus registry and its endpoint (defined in the .cc: empty in builds without
  // metrics).
  struct Metrics;
  std::unique_ptr<Metrics> metrics_;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_RANK_OUTPUTS_H_
