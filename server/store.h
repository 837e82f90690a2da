// Durable state of the coordinator: jobs, workers, the append-only audit of published latches,
// policy changes and step reports (docs/protocol.md "Persistence").
//
// Contract: every mutating call is durable when it returns OK (against a process crash; against
// power loss too when the implementation syncs fully). AppendLatches is the only way latches
// enter the store and it never overwrites one: published latches are immutable.
//
// A stored value this build cannot read back (an unknown K/V mode, a malformed no_sync mask, a
// state number out of range) is DATA_LOSS naming the row: it is never replaced by a default.
//
// Thread-safety: implementations need not be thread-safe; the Coordinator serialises calls. The
// exceptions: the AuditReader a store may hand out (audit_reader()) is thread-safe and may be
// called from any thread while the store's other calls go on; and a store whose
// CommitsBesideOtherCalls() is true lets CommitGroup run beside the other calls.
#ifndef LATCHKEY_SERVER_STORE_H_
#define LATCHKEY_SERVER_STORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/latch.h"
#include "common/rank_position.h"
#include "common/states.h"
#include "common/step_report.h"

namespace latchkey {

struct JobRecord {
  std::string job_id;
  // Drawn at submit (NewJobUid), never changed: the identity the job's checkpoints carry, unique
  // across coordinators (whose job ids repeat). Schema v10 gave every job before one.
  std::string job_uid;
  int64_t seq = 0;  // submission order, 1-based
  JobState state = JobState::kPending;
  std::string spec_json;  // canonical (JobSpecToJson): paths absolute
  std::string base_dir;
  std::string join_token;       // its SHA-256 in hex (Sha256Hex); the token itself is never stored
  std::string submitter;        // the NAME of the role token that submitted it; "": none
  std::string rendezvous_host;  // empty until known
  int rendezvous_port = 0;
  bool rendezvous_host_fixed = false;  // set by the submitter (else: rank 0's host)
  LatchPolicy policy;                  // every field persisted, the no_sync mask included
  int64_t next_window = 0;             // first unpublished window
  int64_t next_first_micro_batch = 0;  // M of next_window
  int64_t next_first_sample = 0;       // first_sample of next_window
  std::string failure_reason;
  std::vector<std::string> warnings;
  absl::Time create_time = absl::UnixEpoch();
  absl::Time update_time = absl::UnixEpoch();
  // Fault tolerance (docs/fault-tolerance.md): the current attempt (from 1) and how it began.
  int64_t attempt = 1;
  int restarts = 0;                    // recoveries so far (an elastic shrink or grow: none)
  int64_t resume_step = -1;            // the checkpoint the current attempt resumes from
  std::string resume_manifest_sha256;  // its manifest's SHA-256
  int64_t last_checkpoint_step = -1;   // newest committed checkpoint; -1: none
  std::string last_checkpoint_sha256;  // its manifest's SHA-256
  std::string last_recovery_reason;    // the cause of the latest recovery
  std::vector<StalledRank> stalled;    // stall verdicts still listed
  int64_t determinism_violations = 0;  // re-run steps whose loss differed from the first report
};

struct WorkerRecord {
  std::string job_id;
  int rank = 0;
  std::string worker_id;
  std::string host;
  WorkerState state = WorkerState::kJoined;
  absl::Time join_time = absl::UnixEpoch();
  int64_t attempt = 1;  // the job attempt this worker joined
};

struct PublishedLatch {
  Latch latch;
  absl::Time publish_time = absl::UnixEpoch();
  // The attempt whose layout decided it (1: the spec's layout, from the start). An attempt with
  // a new layout (elastic recovery) re-decides every window after its resume step; the latches
  // of the old layout stay stored, immutable, and the newest layout's latch of a window is the
  // one that counts (LoadLatches).
  int64_t layout_attempt = 1;
};

// An attempt after the first, as it began (docs/fault-tolerance.md): its layout, the
// checkpoint it resumed from and the cause. Attempt 1 runs the spec's layout from the start and
// has no record.
struct AttemptRecord {
  std::string job_id;
  int64_t attempt = 2;
  int world_size = 1;
  int tp = 1;
  int dp = 1;
  int gradient_accumulation_steps = 1;
  int64_t resume_step = -1;
  std::string cause;
  // The attempt whose layout it runs: itself when its layout is new, else the attempt that
  // began that layout (its latches are served).
  int64_t layout_attempt = 1;
  absl::Time start_time = absl::UnixEpoch();
};

struct PolicyChangeRecord {
  std::string job_id;
  LatchPolicy policy;
  int64_t first_window = 0;
  absl::Time change_time = absl::UnixEpoch();
};

// One rank's report of one step, as stored. StepReport's optimizer_state_bytes,
// latch_wait_seconds and checkpoint_seconds are not on the wire (ReportStep) and not stored:
// they read back as 0 (none).
struct StepReportRecord {
  std::string job_id;
  int rank = 0;
  StepReport report;
  absl::Time report_time = absl::UnixEpoch();
  // false: stored before schema v4 kept report.boundary_wait_seconds (it reads back as 0).
  bool boundary_wait_stored = true;
  // false: read back from the store, which keeps no report.collective_seconds (it reads as 0).
  bool collective_seconds_stored = true;
};

// A committed resumable checkpoint (ReportCheckpoint); one per (job_id, step), the latest
// report of a step kept (a later attempt may commit the same step again).
struct CheckpointRecord {
  std::string job_id;
  int64_t step = 0;
  std::string manifest_sha256;
  int64_t bytes = 0;
  int64_t attempt = 1;
  absl::Time report_time = absl::UnixEpoch();
};

// One entry of a job's audit log besides latches and policy changes (append-only).
struct JobEventRecord {
  std::string job_id;
  absl::Time time = absl::UnixEpoch();
  int64_t attempt = 1;
  std::string kind;  // "recovery", "stalled", "determinism_violation", "checkpoint", "fenced",
                     // "refused_report"
  std::string message;
};

// Highest step a rank has reported.
struct RankProgress {
  std::string job_id;
  int rank = 0;
  int64_t max_step = -1;
};

// A job's audit as one consistent read: the rows of LoadLatches, LoadPolicyChanges and LoadEvents
// as of one moment (none of them from a later commit than another).
struct AuditRows {
  std::vector<PublishedLatch> latches;
  std::vector<PolicyChangeRecord> policy_changes;
  std::vector<JobEventRecord> events;
};

// Reads the append-only audit of a store without the store's callers' serialisation: for readers
// (the status page) that must not wait behind the writes, nor make them wait.
// Contract: sees only what the store's mutating calls have committed (returned OK for).
// Thread-safety: thread-safe; it may run concurrently with every JobStore call. Owned by its
// store and valid as long as the store.
class AuditReader {
 public:
  virtual ~AuditReader() = default;
  // Latches of one job with window >= start_window, window order, at most `limit`; every policy
  // change of the job (generation order) and every event (append order). Errors as the Load*
  // calls.
  virtual absl::StatusOr<AuditRows> ReadAudit(const std::string& job_id, int64_t start_window,
                                              int64_t limit) = 0;
};

class JobStore {
 public:
  virtual ~JobStore() = default;

  // The store's AuditReader, or null when it has none (then the audit is read through the Load*
  // calls, serialised with the rest). Owned by the store.
  virtual AuditReader* audit_reader() { return nullptr; }

  virtual absl::Status CreateJob(const JobRecord& job) = 0;
  // Writes state, rendezvous, failure_reason, update_time and the fault-tolerance fields (attempt
  // ... determinism_violations; not the latch position or the policy: those move only with
  // AppendLatches / AppendPolicyChange).
  virtual absl::Status UpdateJob(const JobRecord& job) = 0;
  // UpdateJob and AppendEvent in one transaction (a recovery and its audit entry).
  virtual absl::Status UpdateJobWithEvent(const JobRecord& job, const JobEventRecord& event) = 0;
  virtual absl::Status AppendEvent(const JobEventRecord& event) = 0;
  // Inserts or replaces the checkpoint of (job_id, step), UpdateJob(job) and AppendEvent(event),
  // in one transaction.
  virtual absl::Status PutCheckpoint(const CheckpointRecord& checkpoint, const JobRecord& job,
                                     const JobEventRecord& event) = 0;
  // A new attempt: UpdateJob(job), the attempt's record and `event` in one transaction. With
  // `layout_change` (an attempt with a new layout) also the policy change it begins under
  // (as AppendPolicyChange) and the job's latch position moved back to job.next_window /
  // job.next_first_micro_batch (the first window the new layout decides).
  virtual absl::Status BeginAttempt(const JobRecord& job, const AttemptRecord& attempt,
                                    const PolicyChangeRecord* layout_change,
                                    const JobEventRecord& event) = 0;
  // Inserts or replaces the worker holding (job_id, rank).
  virtual absl::Status PutWorker(const WorkerRecord& worker) = 0;
  // Appends consecutive latches and moves the job's next window / next M / next first_sample to
  // follow the last, atomically. FAILED_PRECONDITION if a window is already stored (latches
  // never change).
  virtual absl::Status AppendLatches(const std::string& job_id,
                                     const std::vector<PublishedLatch>& latches,
                                     int64_t next_window, int64_t next_first_micro_batch,
                                     int64_t next_first_sample) = 0;
  // Records a policy change and makes it the job's current policy, atomically.
  virtual absl::Status AppendPolicyChange(const PolicyChangeRecord& change) = 0;
  // true if stored; false if (job, rank, step) was already there (the first report is kept).
  virtual absl::StatusOr<bool> InsertStepReport(const StepReportRecord& report) = 0;
  // Group commit of step reports: what InsertStepReport answers, but the report is staged in
  // the store's group and is durable only once CommitGroup returned OK. Reads see staged
  // reports; every other mutating call commits the group first, so nothing written later is
  // durable before them. A store without groups (the default) stores at once, and CommitGroup
  // has nothing to do.
  //
  // A failed commit of the group, by CommitGroup or by another mutating call, loses nothing:
  // every staged report stays staged (HasStaged() true), the call returns the commit's error,
  // and the next commit retries them. Only a report the store refuses for itself (a row no
  // retry can store) is lost: that call returns DATA_LOSS naming how many, and every later
  // CommitGroup returns DATA_LOSS too (after committing what else is staged), so a caller never
  // takes it for durable. A repeat of a staged report answers false (stored) and is durable
  // with the group's commit.
  virtual absl::StatusOr<bool> StageStepReport(const StepReportRecord& report) {
    return InsertStepReport(report);
  }
  // OK: every report staged so far is durable (nothing staged: at once). Otherwise: the
  // commit's error with the group still staged, or DATA_LOSS (see above).
  virtual absl::Status CommitGroup() { return absl::OkStatus(); }
  // Whether staged reports are not yet durable (also after a failed commit, and while a
  // CommitGroup runs).
  virtual bool HasStaged() const { return false; }
  // Whether CommitGroup may run on another thread beside every other call of the store (which
  // the caller still serialises among themselves): the store then orders its writers itself,
  // and StageStepReport and HasStaged do not wait for a commit in progress. false (the
  // default): CommitGroup is serialised with the other calls like any of them.
  virtual bool CommitsBesideOtherCalls() const { return false; }

  virtual absl::StatusOr<std::vector<JobRecord>> LoadJobs() = 0;  // seq order
  virtual absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers() = 0;
  virtual absl::StatusOr<std::vector<RankProgress>> LoadProgress() = 0;
  // Latches of one job with window >= start_window, window order, at most `limit`: per window
  // the one of the newest layout that decided it.
  virtual absl::StatusOr<std::vector<PublishedLatch>> LoadLatches(const std::string& job_id,
                                                                  int64_t start_window,
                                                                  int64_t limit) = 0;
  virtual absl::StatusOr<std::vector<PolicyChangeRecord>> LoadPolicyChanges(
      const std::string& job_id) = 0;
  // Step reports of one job with step >= from_step, (step, rank) order.
  virtual absl::StatusOr<std::vector<StepReportRecord>> LoadStepReports(const std::string& job_id,
                                                                        int64_t from_step) = 0;
  // The stored (first) report of (job_id, rank, step); NOT_FOUND if there is none.
  virtual absl::StatusOr<StepReportRecord> LoadStepReport(const std::string& job_id, int rank,
                                                          int64_t step) = 0;
  // Checkpoints of one job, step order.
  virtual absl::StatusOr<std::vector<CheckpointRecord>> LoadCheckpoints(
      const std::string& job_id) = 0;
  // Events of one job, in the order they were appended.
  virtual absl::StatusOr<std::vector<JobEventRecord>> LoadEvents(const std::string& job_id) = 0;
  // The records of a job's attempts after the first, attempt order.
  virtual absl::StatusOr<std::vector<AttemptRecord>> LoadAttempts(const std::string& job_id) = 0;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_STORE_H_
