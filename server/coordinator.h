// The coordinator's core: job registry, rank assignment, job lifecycle with liveness deadlines,
// and the latch authority. Plain C++ and absl::Status only; the gRPC services (job_service.h,
// worker_service.h) are thin adapters over this class.
//
// Latch authority: latch(s) = DecideLatch(spec, policy, s, M_s, F_s), published in window order
// while the job runs, at most `latch_lookahead` windows beyond the slowest rank's current window
// (its reported steps), persisted (JobStore::AppendLatches) before any caller can see it, and
// never changed afterwards. A policy update applies from the first unpublished window, for every
// rank alike. M_s advances by each published n_s and F_s by n_s * DP * MB, so a change of
// accumulation steps keeps the data order.
//
// Inside, each concern has one owner (private headers, not part of this interface): LatchLog
// (publication, lookahead position, the latch cache), AttemptLog (the attempts, their layouts,
// the fence), JobStateMachine (job and worker states), StepAggregator (per-step summaries),
// RankTable (who holds which rank, liveness), BoundaryArrivals (arrival lag); the coordinator's
// .cc files are one per concern (coordinator.cc names them).
//
// Attempts (docs/fault-tolerance.md; attempt_log.h, coordinator_attempts.cc): a job runs in
// attempts, from 1.
// A failure of a running or recovering job (ReportFailure, a missed liveness deadline, a stall
// verdict of the hang detector) starts a recovery while restarts < the spec's
// latchkey.max_restarts: attempt + 1, restarts + 1, resume step = the newest committed checkpoint
// (-1: none), state RECOVERING and the cause, persisted in one transaction with a "recovery"
// event; every rank is freed and every worker of the old attempt is fenced. Once every rank has
// joined the new attempt the job is RUNNING again; published latches are served as stored. A
// rank not joined within the liveness timeout of the recovery's start is a failure of that rank
// ("rank R did not rejoin attempt A within 30s"): the next recovery, or FAILED.
// Past max_restarts the job fails naming the cause ("... (after N restarts)"). ResumeJob
// reopens a failed or cancelled job the same way (a "resumed" event, no restart spent).
//
// Fencing: every worker call but Join names the attempt the worker joined (WorkerCall::attempt).
// A call of another attempt than the job's is ABORTED
//   "worker W is at attempt A; job J is at attempt B (fenced)"
// with the ErrorInfo {reason ATTEMPT_FENCED, metadata job_attempt B, worker_attempt A}
// (common/error_info.h), and changes nothing. Attempt 0 stands for the attempt the worker holds (or
// last held) its rank in: a supervisor reporting a dead process, or a client that predates
// attempts.
//
// Errors: unknown job NOT_FOUND; bad join token UNAUTHENTICATED; wrong state
// FAILED_PRECONDITION; stale generation or rank conflict ABORTED; bad input INVALID_ARGUMENT
// naming the field; a damaged store DATA_LOSS; after Shutdown() UNAVAILABLE.
//
// Thread-safety: every public method is thread-safe. The Wait* methods block (up to their
// deadline) without holding the lock.
#ifndef LATCHKEY_SERVER_COORDINATOR_H_
#define LATCHKEY_SERVER_COORDINATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/job_info.h"
#include "common/job_spec.h"
#include "common/join_info.h"
#include "common/latch.h"
#include "common/rank_position.h"
#include "common/reachability.h"
#include "common/spec_limits.h"
#include "common/timeouts.h"
#include "common/worker_protocol.h"
#include "server/attempt_log.h"
#include "server/partition.h"
#include "server/store.h"
#include "server/trace_request.h"

namespace latchkey {

class JobStateMachine;

struct CoordinatorOptions {
  // Windows published beyond the window the slowest rank is running, so a short coordinator
  // pause does not stall training. 0: only the current window.
  int latch_lookahead = 2;
  // A worker unseen (Join, Heartbeat, ReportStep, ReportCheckpoint, WatchLatches) for this long
  // fails its rank (a recovery, or the job fails); a recovering job waits this long after the
  // recovery began for every rank to join the new attempt.
  absl::Duration liveness_timeout = absl::FromChrono(kDefaultLivenessTimeout);
  // Stamps records and measures liveness; null: RealClock(). Not owned; must outlive the
  // coordinator. The Wait* deadlines are real time (absl::Now()) whatever the clock.
  const Clock* clock = nullptr;
  // Told to workers at Join; well under the liveness timeout. Two intervals without a heartbeat
  // make a rank silent for the hang detector. A large job is told a longer one (see
  // job_heartbeats_per_second).
  absl::Duration heartbeat_interval = absl::FromChrono(kDefaultHeartbeatInterval);
  // The most heartbeats a second the ranks of one job send together: a job of more ranks than
  // heartbeat_interval x this is asked to heartbeat every world_size / this seconds instead (at
  // most liveness_timeout / 3), so the coordinator's heartbeat load stays bounded whatever the
  // job's size (16,384 ranks: every 4 s). Liveness does not depend on it: an open latch stream
  // counts as alive, and every report refreshes the rank.
  int job_heartbeats_per_second = 4096;
  // Rendezvous ports handed out at submit when the submitter names none (inclusive range).
  int rendezvous_port_first = 29500;
  int rendezvous_port_last = 29999;
  size_t max_spec_bytes = 256 * 1024;
  // Model-size budget and data roots every submitted spec must respect (CheckSpecLimits).
  SpecLimits spec_limits;
  size_t recent_steps = 64;  // completed step summaries kept in memory per job for watchers
  // One line per job event (state change, join, policy change); null: silent. Called with the
  // coordinator's lock held: must be quick and must not call back.
  std::function<void(const std::string&)> log;
  // Called when acknowledged progress can no longer be made durable: staged step reports were
  // lost (the store's DATA_LOSS), so the coordinator's progress is ahead of its store. Null:
  // the reason goes to stderr and the process aborts (crash-only: a restart reloads the store's
  // consistent state and the workers send their unacknowledged reports again). A replacement
  // that returns lets the coordinator go on failing those reports' calls with the error.
  // Called on the group committer's thread with the coordinator's lock held: must not call back.
  std::function<void(const absl::Status&)> on_fatal;
};

// Receives counts for metrics. Called with the coordinator's lock held: must not call back.
class CoordinatorObserver {
 public:
  virtual ~CoordinatorObserver() = default;
  virtual void AddJobs(JobState state, int delta) = 0;
  virtual void AddWorkers(WorkerState state, int delta) = 0;
  virtual void LatchPublished(KvMode mode) = 0;
  // Stall verdicts listed on live jobs (JobRecord::stalled) changed by `delta`.
  virtual void AddStalledRanks(int /*delta*/) {}
  // A job began a new attempt.
  virtual void JobRestarted() {}
  // Every rank reported one window: max - min of their boundary waits.
  virtual void BoundaryArrivalLag(double /*seconds*/) {}
  // One group commit of step reports took `seconds`; `lock_held`: with the coordinator's lock
  // held all along (a store that cannot commit beside the other calls).
  virtual void GroupCommitted(double /*seconds*/, bool /*lock_held*/) {}
  // (rank, peer) pairs live jobs' ranks report unreachable now.
  virtual void UnreachablePeers(int /*pairs*/) {}
  // Every rank of a job reported a step: each rank's slowdown (docs/fault-tolerance.md
  // "Stragglers"); empty when the job ended (its series go).
  virtual void RankSlowdowns(const std::string& /*job_id*/, const std::vector<double>& /*s*/) {}
};

struct JobView {
  JobRecord record;  // join_token cleared
  int world_size = 0;
  int tp = 0;
  int dp = 0;
  int64_t steps = 0;
  int workers_joined = 0;
  std::vector<JobWorkerInfo> workers;  // only where asked for; rank order, joined ranks only
  int64_t steps_completed = 0;
  std::optional<CompletedStep> last_step;
  std::optional<CompletedStep> last_eval;  // the newest completed step that evaluated
  int max_restarts = 0;                    // the spec's latchkey.max_restarts
  std::vector<WindowArrival> slowest;      // the last windows' slowest ranks, newest last
  std::vector<StragglerInfo> stragglers;   // the ranks named slow now
  std::vector<int> replica_micro_batches;  // the newest latch's split; empty: even
  int spec_world_size = 0;                 // world_size/tp/dp above are the current attempt's
  std::vector<AttemptSummary> attempts;
};

// One job as the status page shows it, copied under one short lock (no wait, no store read).
struct JobSnapshot {
  JobView job;                       // with its workers
  std::vector<CompletedStep> steps;  // the completed steps kept in memory, in order
};

struct SubmitResult {
  JobView job;
  std::string join_token;          // "" when the submission gave its hash, or on a repeat
  bool already_submitted = false;  // the same job id and request again: nothing created
};

struct JobWatchUpdate {
  uint64_t version = 0;  // pass back as after_version
  JobView job;
  std::vector<CompletedStep> steps;  // completed steps after `after_step`, in order
};

struct LatchAudit {
  std::vector<PublishedLatch> latches;
  std::vector<PolicyChangeRecord> policy_changes;
  std::vector<JobEventRecord> events;  // every event of the job, in order
  int64_t next_start_window = 0;       // 0: no more
};

// Who a worker call comes from.
struct WorkerCall {
  std::string job_id;
  std::string join_token;
  std::string worker_id;
  int rank = -1;  // not used by Join
  // The attempt the worker joined (JoinResult::attempt); not used by Join. 0: the attempt this
  // worker holds (or last held) its rank in.
  int64_t attempt = 0;
};

struct JoinArgs {
  WorkerCall call;
  std::optional<int> requested_rank;
  std::string advertise_host;
  std::string peer_host;  // the host part of the caller's address, as the transport saw it
  int probe_port = 0;     // its reachability listener on the host it is reached at (0: none)
  std::string node;       // the node it runs on (a node agent's identity); empty: its host
};
// The rank's answer (common/join_info.h); tp_rank and dp_rank from the job's RankGrid.
using JoinResult = JoinInfo;

struct LatchBatch {
  std::vector<PublishedLatch> latches;  // consecutive, from the requested window
  bool job_ended = false;               // no further latch will come
  // The attempt stops (a preemption or a suspend): no latch from this window on; the rank saves
  // the state after stop_before - 1 and leaves. -1: no stop.
  int64_t stop_before = -1;
  JobState state = JobState::kPending;
  std::string reason;
};

// Told that a job changed (a latch was published, the job ended, the coordinator is shutting
// down). Called from the coordinator's notifier thread with no coordinator lock held: it may call
// back into the Coordinator. Must not block for long, and must tolerate a call after
// Unsubscribe (the notifier may hold a reference for one last round).
class JobListener {
 public:
  virtual ~JobListener() = default;
  virtual void OnJobChanged() = 0;
};

struct Subscription {
  std::string job_id;
  int rank = -1;
  uint64_t id = 0;
  int64_t attempt = 1;  // the job's attempt when the stream opened
};

struct WorkerStatus {
  JobState state = JobState::kPending;
  std::string reason;
  bool duplicate = false;  // ReportStep only
  int64_t attempt = 1;     // the job's current attempt (after the call)
  PeerList peers;          // Heartbeat: the peer list's version, and its peers when asked for
  bool stop = false;       // Heartbeat: the attempt is stopping (Leave, SuspendJob)
  TraceAsk trace{};        // Heartbeat: an open trace request this rank has not answered
};

// What a heartbeat carries besides the caller (docs/protocol.md).
struct HeartbeatArgs {
  std::optional<RankPosition> position;  // none from an older client
  std::optional<Reachability> reach;     // the rank's newest probe round of its peers
  bool want_peers = false;               // answer with the peer list
  int probe_port = 0;                    // the worker's probe port (0: unknown)
};

// The same values as JobService's plain types (common/job_info.h), which proto/wire.h puts on
// the wire. The join token is never part of them.
JobInfo ToJobInfo(const JobView& view);
LatchAuditPage ToAuditPage(const LatchAudit& audit);

class Coordinator {
 public:
  // Loads every job from `store` and resumes them (workers get a fresh liveness deadline).
  // `observer` may be null; when set it must outlive the coordinator.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(std::unique_ptr<JobStore> store,
                                                             CoordinatorOptions options,
                                                             CoordinatorObserver* observer);
  ~Coordinator();  // calls Shutdown()
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Starts the liveness checker thread (tests may call CheckLiveness() themselves instead).
  void StartLivenessChecker();
  // Wakes every waiter and refuses further calls with UNAVAILABLE. Idempotent.
  void Shutdown();

  // --- JobService ---
  // `submitter`: the NAME of the role token that submitted it ("" without --auth-tokens).
  absl::StatusOr<SubmitResult> SubmitJob(const JobSubmission& args,
                                         const std::string& submitter = "");
  absl::StatusOr<JobView> GetJob(const std::string& job_id, bool with_workers);
  // Non-blocking: the job with its workers and its completed steps in memory.
  absl::StatusOr<JobSnapshot> Snapshot(const std::string& job_id);
  // The world sizes of every job not yet ended (or ended with latch streams still open),
  // summed: the per-peer call cap follows it, so every call asks; a counter kept with each
  // job's state and streams, read without the lock.
  int LiveRanks() const;
  absl::StatusOr<std::vector<JobView>> ListJobs(const std::vector<JobState>& states, int limit);
  absl::StatusOr<JobView> CancelJob(const std::string& job_id, const std::string& reason);
  // A failed or cancelled job continues (coordinator_attempts.cc): a new attempt, RECOVERING,
  // that resumes from rec.last_checkpoint_step (-1: from the start, and the event says so),
  // persisted as a recovery is, with a "resumed" event naming `reason` ("" : "resumed by
  // user"). No restart is spent and restarts count from 0 again (max_restarts from here). An
  // elastic job asks for the spec's layout again (a shrink follows if fewer workers come).
  // FAILED_PRECONDITION naming the state for a pending, running, recovering or succeeded job,
  // for a job whose stored spec this build cannot parse, and when another live job holds its
  // rendezvous port.
  absl::StatusOr<JobView> ResumeJob(const std::string& job_id, const std::string& reason);
  // A running job saves its last completed step and stops, then waits, `suspended`, for
  // ResumeJob (coordinator_stop.cc); a pending, recovering or preempted one is suspended at
  // once. Same role as CancelJob.
  absl::StatusOr<JobView> SuspendJob(const std::string& job_id, const std::string& reason);
  absl::StatusOr<JobPolicyUpdateResult> UpdateJobPolicy(const JobPolicyUpdate& update);
  // Returns once the job changed after `after_version` (immediately for 0) or at `deadline`
  // (DEADLINE_EXCEEDED).
  absl::StatusOr<JobWatchUpdate> WaitJobChange(const std::string& job_id, uint64_t after_version,
                                               int64_t after_step, absl::Time deadline);
  absl::StatusOr<LatchAudit> ListLatches(const std::string& job_id, int64_t start_window,
                                         int limit);
  // For the status page: what ListLatches returns (the same rows, limits and errors), read
  // without making any other call wait on disk. It takes the coordinator's lock only to find the
  // job (a map lookup, as Snapshot), and reads the store through its AuditReader with no
  // coordinator lock held: sound because the rows are the append-only audit, committed before
  // any caller could see them and never changed afterwards (published latches are immutable).
  // Without an AuditReader (an in-memory store) it is ListLatches, under the lock.
  absl::StatusOr<LatchAudit> ReadAudit(const std::string& job_id, int64_t start_window, int limit);
  // GetTrace (coordinator_trace.cc): asks every live rank of a running job, through its
  // heartbeats, for its spans of steps first..last (-1: no bound); waits up to `timeout`.
  absl::StatusOr<TraceAnswers> CollectTrace(const std::string& job_id, int64_t first_step,
                                            int64_t last_step, absl::Duration timeout);

  // --- WorkerService ---
  // Joins the job's current attempt. The same worker id gets the same rank back while the
  // attempt lasts; after a recovery every rank is free and a worker (the same id from a
  // surviving process, or a new one) claims one again. For attempt >= 2 the rendezvous host is
  // empty until rank 0 of the attempt has joined (join again until it is set).
  absl::StatusOr<JoinResult> Join(const JoinArgs& args);
  // Returns the published latches from `window` on (at most `max`), or job_ended, waiting up to
  // `deadline` (DEADLINE_EXCEEDED) while there is neither.
  absl::StatusOr<LatchBatch> WaitLatches(const WorkerCall& call, int64_t window, int max,
                                         absl::Time deadline);
  // Non-blocking: what WaitLatches would return now; an empty batch when there is nothing yet.
  absl::StatusOr<LatchBatch> PollLatches(const WorkerCall& call, int64_t window, int max);
  // Registers a latch stream: `listener` hears of every change of the job until Unsubscribe.
  // While a rank has a stream open it counts as alive (its connection closes if it dies).
  // Errors as WaitLatches (the call is checked).
  absl::StatusOr<Subscription> SubscribeLatches(const WorkerCall& call,
                                                std::shared_ptr<JobListener> listener);
  void Unsubscribe(const Subscription& subscription);
  // A report of a step already stored (a re-run after a recovery, or a retry) is acknowledged
  // as duplicate (the first report is kept) and still moves the rank's progress in this
  // attempt; a re-run whose loss differs bitwise from the first report is a determinism
  // violation (event and JobRecord::determinism_violations, once per step and attempt). A
  // report no worker of the job could honestly send is refused and audited (RefuseReport): a
  // rank the caller does not hold, a step outside the job or not published yet, a retry in the
  // same attempt with other numbers than the stored report's (ABORTED), a collective_calls map
  // over kMaxCollectiveKeys keys or with a key over kMaxCollectiveKeyBytes.
  // Returns once the report is durable: reports are group-committed (the store's
  // StageStepReport), one commit for every report that arrived within kGroupCommitWindow (or
  // sooner, when another write commits the group); the job's progress moves at once. While
  // the commit fails the call keeps waiting (a repeat of the report waits for the same commit)
  // and ends with the commit's error only if the coordinator shuts down meanwhile.
  absl::StatusOr<WorkerStatus> ReportStep(const WorkerCall& call, StepReportRecord report);
  // The same without blocking: `done` runs once the report is durable (or with the error), on
  // the caller's thread for an answer known at once, else on the group committer's thread,
  // with no coordinator lock held.
  void ReportStep(const WorkerCall& call, StepReportRecord report,
                  std::function<void(absl::StatusOr<WorkerStatus>)> done);
  static constexpr absl::Duration kGroupCommitWindow = absl::Milliseconds(2);
  static constexpr int kMaxCollectiveKeys = 1024;
  static constexpr size_t kMaxCollectiveKeyBytes = 256;
  static constexpr size_t kMaxManifestShaBytes = 256;
  // Refused reports recorded as events per job and attempt; the rest are only refused.
  static constexpr int kMaxRefusalEvents = 20;
  // A failed group commit keeps its reports staged and unacknowledged and is retried after
  // kCommitRetryFirst, doubling up to kCommitRetryMax, until it succeeds (or the coordinator
  // stops: the calls fail with the commit's error).
  static constexpr absl::Duration kCommitRetryFirst = absl::Milliseconds(50);
  static constexpr absl::Duration kCommitRetryMax = absl::Seconds(2);
  // `position`: where the rank is (the hang detector's input); none from an older client.
  absl::StatusOr<WorkerStatus> Heartbeat(const WorkerCall& call,
                                         const std::optional<RankPosition>& position = {});
  // The same with a probe round of the rank's peers (docs/fault-tolerance.md "Partitions"): a
  // job waiting to form an attempt starts it once every rank reached every other.
  absl::StatusOr<WorkerStatus> Heartbeat(const WorkerCall& call, const HeartbeatArgs& args);
  // The job recovers (up to max_restarts) or fails, naming the rank and `message`; a
  // `permanent` failure (a configuration error) fails it at once, and so does one whose `reason`
  // (the error's ErrorInfo reason, common/error_info.h) is TRAINING_DIVERGED: a re-run diverges
  // the same way.
  absl::StatusOr<WorkerStatus> ReportFailure(const WorkerCall& call, const std::string& message,
                                             bool permanent = false,
                                             const std::string& reason = "");
  // A committed checkpoint after `report.step`: persisted with a "checkpoint" event; the job's
  // last_checkpoint_step is the newest one. Repeating a report changes nothing.
  absl::StatusOr<WorkerStatus> ReportCheckpoint(const WorkerCall& call,
                                                const CheckpointReport& report);
  // The worker got a stop signal (`reason`, e.g. "SIGTERM"): a running attempt saves its last
  // completed step and stops (the job then `preempted`, no restart spent); a rank of a job that
  // is not training gives its rank up at once (coordinator_stop.cc). Idempotent.
  absl::StatusOr<WorkerStatus> Leave(const WorkerCall& call, const std::string& reason);
  // A rank's answer to the job's open trace request `request_id` (ignored when not open).
  absl::Status PutTrace(const WorkerCall& call, int64_t request_id, std::string jsonl);

  // Every live job with a worker past its liveness deadline, (recovering) with a rank that has
  // not joined the attempt within the liveness timeout of the recovery's start, or (running)
  // stalled by the hang detector, recovers or fails.
  void CheckLiveness();
  // The coordinator did not run for `gap` (the checker thread's monotonic clock jumped: a
  // SIGSTOP, a frozen VM, a long stall): every rank of every live job counts as seen now and
  // gets no liveness verdict for two liveness timeouts, a
  // recovery's rejoin window restarts now, and no hang verdict is given for the job's
  // hang_timeout_seconds. The checker thread calls it when its checks start more than
  // kPauseThreshold later than their period; tests may call it themselves.
  void GraceAfterPause(absl::Duration gap);
  // Own-network suspicion (SuspectOwnNetwork): how long every rank must have been silent.
  static constexpr absl::Duration kAllSilentAfter = absl::Seconds(4);
  static constexpr absl::Duration kPauseThreshold = absl::Seconds(2);

  const CoordinatorOptions& options() const { return options_; }
  // The heartbeat interval a job of `world_size` ranks is told (job_heartbeats_per_second).
  absl::Duration HeartbeatInterval(int world_size) const;

 private:
  struct Job;  // coordinator_internal.h

  Coordinator(std::unique_ptr<JobStore> store, CoordinatorOptions options,
              CoordinatorObserver* observer);
  // Restoring (coordinator_load.cc): rebuilds every job from the store and finishes what a
  // crash interrupted.
  absl::Status Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::StatusOr<Job*> FindJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FindJob + token check + the attempt fence (not for Join: fence false) (+ rank ownership
  // when check_rank).
  absl::StatusOr<Job*> FindForWorker(const WorkerCall& call, bool check_rank, bool fence = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Joining (coordinator_workers.cc): a new worker claims a rank of the current attempt (persisted,
  // and the job starts once every rank is held); what Join answers for `rank`.
  absl::StatusOr<int> ClaimRank(Job& job, const JoinArgs& args) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JoinResult JoinResultFor(const Job& job, int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic spares: whether a new worker asking for `requested` gets a rank of the current
  // layout now; the answer a spare gets (spare set, no rank).
  bool HasRankFor(const Job& job, std::optional<int> requested) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JoinResult SpareResult(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Recovery decisions (coordinator_attempts.cc). A failure of `rank` (-1: none in particular; it
  // becomes `worker_state`) with `cause`: a recovery while restarts remain, else the job fails.
  absl::Status FailOrRecover(Job& job, int rank, WorkerState worker_state, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BeginAttempt(Job& job, AttemptLog::Recovery recovery)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elastic recovery (coordinator_attempts.cc). The spares still polling (the others dropped).
  int LiveSpares(Job& job, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A recovering elastic job whose ranks did not all come back: a new attempt in the smaller
  // layout its joined workers and spares fill, spending no restart. true when it began one.
  bool MaybeShrink(Job& job, const std::string& cause, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At a committed checkpoint: a shrunk elastic job whose spares fill a whole DP replica grows
  // toward the spec's dp (a new attempt resumed from it, no restart spent).
  absl::Status MaybeGrow(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees every rank for the job's (new) attempt, fencing the old holders.
  void ResetRanks(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops (coordinator_stop.cc). A running job stops before its first unpublished window,
  // becoming `to` once the checkpoint of the window before it commits.
  void BeginStop(Job& job, JobState to, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rank of a job that is not training gives its rank up (its holder left, or went silent
  // while a preempted job waited): the worker lost and fenced, the rank free.
  absl::Status ReleaseRank(Job& job, int rank, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After checkpoint `step` committed (or was found committed already): ends the stop it ends.
  absl::Status MaybeFinishStop(Job& job, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Liveness and hang verdicts (coordinator_liveness.cc).
  // The hang detector over a running job; true when it started a recovery or failed the job.
  bool CheckHang(Job& job, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Liveness verdict for the ranks in `late`.
  void LivenessVerdict(Job& job, const std::vector<int>& late, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A recovering job whose ranks have not all joined within the liveness timeout of the
  // recovery's start: a failure of the missing ranks. true when it gave a verdict.
  bool CheckRejoin(Job& job, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Partitions (coordinator_partition.cc, server/partition.h). The cut links the job's ranks
  // report now (fresh reports of the current peer list only).
  std::optional<PartitionVerdict> CurrentPartition(const Job& job, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The peer list of the job's attempt (every rank's probe address), once all have joined.
  PeerList PeersOf(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A pending or recovering job whose ranks have all joined: started once every rank reported
  // every other reachable (at once when its ranks are on one host or a rank cannot probe);
  // while a link is cut it waits, no restart spent, up to latchkey.partition_timeout_seconds,
  // then fails naming the link.
  absl::Status MaybeStart(Job& job, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every rank of every live job fell silent at once, across hosts: this coordinator's own
  // network is the likelier fault. true while it suspects it (no verdict is given meanwhile).
  bool SuspectOwnNetwork(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grace for every live job (GraceAfterPause, and after hearing from ranks again).
  int GrantGrace(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops stall verdicts once the attempt they caused completed a step.
  absl::Status ClearStalled(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Progress reports (coordinator_reports.cc): ReportStep up to the durable acknowledgement;
  // `ticket`: the group commit that makes it durable.
  absl::StatusOr<WorkerStatus> StageReport(const WorkerCall& call, StepReportRecord record,
                                           uint64_t* ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `done` once group commit `ticket` is durable (at once when it is).
  void WhenDurable(uint64_t ticket, std::function<void(absl::Status)> done)
      ABSL_LOCKS_EXCLUDED(mu_);
  void CommitterLoop();
  // The store lost staged step reports (`why`): logs it and hands it to options_.on_fatal, by
  // default ending the process.
  void TerminateOnLostReports(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A re-run's report against the stored first one.
  absl::Status CheckDeterminism(Job& job, const StepReportRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A retry (a step this rank reported in this attempt) against the stored report: what
  // differs ("" when its numbers are the stored ones).
  absl::StatusOr<std::string> RetryConflict(const Job& job, const StepReportRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `why`, after recording it in the job's audit (event "refused_report", at most
  // kMaxRefusalEvents per attempt): a report of `what` no worker of the job could honestly send.
  absl::Status RefuseReport(Job& job, const WorkerCall& call, const std::string& what,
                            absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checks of a report's identity and step every report kind makes, each refusal audited.
  absl::StatusOr<Job*> FindReporter(const WorkerCall& call, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An event of the job's current attempt, stamped now.
  JobEventRecord Event(const Job& job, const std::string& kind, const std::string& message) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs "JOB: message" and appends it to the audit as an event of `kind`; an event the store
  // refuses is logged, not returned (the audit is a record, not a precondition).
  void RecordEvent(const Job& job, const std::string& kind, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobView View(const Job& job, bool with_workers) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // State changes go through the JobStateMachine; these also wake the job's waiters.
  absl::Status StartJob(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `event` (may be null): the audit's record of the end, persisted with it.
  absl::Status EndJob(Job& job, JobState state, const std::string& reason, WorkerState worker_state,
                      const JobEventRecord* event = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SetWorkerState(Job& job, int rank, WorkerState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes latches up to the lookahead frontier of a RUNNING job.
  absl::Status Publish(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stragglers (coordinator_stragglers.cc): a rank's first report of a step scored, and the
  // splits of newly published latches audited when they change.
  void NoteSpeed(Job& job, int rank, const StepReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteSplits(Job& job, const std::vector<PublishedLatch>& published)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a rank's progress moved: completed steps, success, publication.
  absl::Status Advance(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The latches from `window` on, or job_ended; false when the caller has to wait.
  absl::StatusOr<bool> LatchesNow(Job& job, int64_t window, int max, LatchBatch* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Touch(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // version++, wake waiters
  // live_ranks_ after the job's state may have changed (Touch calls it).
  void CountLive(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Log(const std::string& line) const {
    if (options_.log) options_.log(line);
  }
  void NotifierLoop();
  int PickRendezvousPort() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  const Clock* const clock_;
  CoordinatorObserver* const observer_;

  mutable absl::Mutex mu_;
  std::unique_ptr<JobStore> store_ ABSL_GUARDED_BY(mu_);
  // store_'s AuditReader (thread-safe itself: read without mu_), or null; set once at
  // construction, it lives as long as store_.
  AuditReader* const audit_reader_;
  std::unique_ptr<JobStateMachine> machine_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_trace_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int> live_ranks_{0};  // LiveRanks(); written under mu_
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // Since when every rank of every live job has been silent while this coordinator suspects
  // its own network (SuspectOwnNetwork); InfinitePast: it does not.
  absl::Time suspect_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  // Jobs whose listeners are to be told of a change; the notifier thread drains it.
  std::vector<std::string> dirty_jobs_ ABSL_GUARDED_BY(mu_);
  absl::CondVar notify_cv_;
  bool notifier_stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t last_listener_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread notifier_;

  // Group commit of step reports: staged_ counts the reports staged, durable_ those committed.
  uint64_t staged_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t durable_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<uint64_t, std::function<void(absl::Status)>>> durable_waiters_
      ABSL_GUARDED_BY(mu_);
  absl::CondVar commit_cv_;  // a waiter arrived, or the committer stops
  bool committer_stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread committer_;

  absl::Mutex liveness_mu_;
  absl::CondVar liveness_cv_;
  bool liveness_stop_ ABSL_GUARDED_BY(liveness_mu_) = false;
  std::thread liveness_thread_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_COORDINATOR_H_
