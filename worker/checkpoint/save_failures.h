// The count of this process's resumable-checkpoint saves that failed for lack of room and were
// dropped (docs/fault-tolerance.md, "Disk full"): the checkpoint manager counts each one, the
// rank's metrics export the count (latchkey_checkpoint_failures_total, worker/metrics/). A
// worker process runs one rank, so the count is the rank's.
//
// Torch-free. Thread-safety: both functions are thread-safe (one atomic).
#ifndef LATCHKEY_WORKER_CHECKPOINT_SAVE_FAILURES_H_
#define LATCHKEY_WORKER_CHECKPOINT_SAVE_FAILURES_H_

#include <cstdint>

namespace latchkey {

// One more dropped save; returns the count after it.
int64_t CountCheckpointSaveFailure();
// The saves dropped so far by this process.
int64_t CheckpointSaveFailures();

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_SAVE_FAILURES_H_
