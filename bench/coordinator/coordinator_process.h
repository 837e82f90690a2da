// The coordinator benchmarks' view of one latchkey-coordinator process: started and stopped as
// the tests do (tests/support/coordinator_process.h), measured from /proc (CPU, memory) and
// from its database files.
#ifndef LATCHKEY_BENCH_COORDINATOR_COORDINATOR_PROCESS_H_
#define LATCHKEY_BENCH_COORDINATOR_COORDINATOR_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/support/coordinator_process.h"

namespace latchkey::bench {

using testing::CoordinatorProcess;
using testing::StartCoordinator;
using testing::StopCoordinator;

// utime + stime of a process (/proc/PID/stat), in seconds.
double ProcessCpuSeconds(pid_t pid);
// The process's resident set now (VmRSS) and its peak (VmHWM), in bytes (/proc/PID/status).
int64_t ProcessRssBytes(pid_t pid);
int64_t ProcessPeakRssBytes(pid_t pid);
// Raises this process's open-file limit to its hard limit: a benchmark holds one socket per
// simulated rank or stream, plus gRPC's own descriptors.
void RaiseOpenFileLimit();
// CPU of this process (getrusage), in seconds.
double SelfCpuSeconds();

// Bytes of an SQLite database in WAL mode after its WAL is checkpointed into the main file (from
// a connection of this process, while the coordinator runs): the main file plus what is left
// in the -wal file (0 once the checkpoint completed). -1 when the database cannot be opened.
int64_t CheckpointedDatabaseBytes(const std::string& db);

}  // namespace latchkey::bench

#endif  // LATCHKEY_BENCH_COORDINATOR_COORDINATOR_PROCESS_H_
