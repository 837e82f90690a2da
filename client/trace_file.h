// The job's trace: the ranks' span files (latchkey-worker --trace-jsonl, trace-R.jsonl in a run
// folder) merged into one file in the Chrome Trace Event format that PyTorch's profiler writes,
// which Perfetto's UI, chrome://tracing and HolisticTraceAnalysis read (docs/observability.md
// "Traces").
//
// The file: a process per rank (pid = rank, named "rank R"), a thread per stream (tid 1 train,
// 2 collectives, 3 checkpoint), each span a complete event ("ph": "X"; ts and dur in
// microseconds from baseTimeNanoseconds, on the coordinator's clock). A window is
// "ProfilerStep#S", as PyTorch names a step; a collective is "OP GROUP" (" K/V" added for a K/V
// reduction) with args op, group, bytes, seq, kv. Every event's args carry its step (and
// micro_batch where it has one). The top level has distributedInfo (backend, rank: the first
// rank in the file, world_size, ranks: every rank in it) and clockErrorMicroseconds (the
// largest of the ranks' clock uncertainties; -1 when a rank had no coordinator clock).
#ifndef LATCHKEY_CLIENT_TRACE_FILE_H_
#define LATCHKEY_CLIENT_TRACE_FILE_H_

#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace latchkey {

// One rank's span file: every process's header and spans, in file order.
struct RankTrace {
  int rank = -1;
  int world_size = 0;
  std::string backend;
  std::vector<std::string> workers;  // each process's "host:pid", attempt
  int64_t clock_error_us = -1;       // the largest of its processes' (-1: one had none)
  int64_t dropped = 0;               // spans its rings dropped (full)
  struct Span {
    std::string name;  // "window", "forward", "collective", ... (the file's "span")
    std::string stream;
    int64_t begin_us = 0;  // coordinator clock, Unix microseconds
    int64_t end_us = 0;
    int64_t step = -1;
    int micro_batch = -1;
    std::string op, group;
    int64_t bytes = 0, seq = 0;
    bool kv = false;
  };
  std::vector<Span> spans;
};

// Reads `path` (trace-R.jsonl). INVALID_ARGUMENT naming the file and line for a line that is
// not a header or span object; NOT_FOUND when it cannot be opened.
absl::StatusOr<RankTrace> ReadRankTrace(const std::string& path);
// The same from the text of one (a rank's answer to JobService.GetTrace); errors name `source`.
absl::StatusOr<RankTrace> ParseRankTrace(const std::string& text, const std::string& source);

// Every trace-R.jsonl directly in `dir`, by rank. NOT_FOUND when there is none.
absl::StatusOr<std::vector<RankTrace>> ReadRankTraces(const std::string& dir);

// "A..B", "A.." or "A" (one step): the steps kept. INVALID_ARGUMENT naming --steps.
struct StepRange {
  int64_t first = 0;
  int64_t last = std::numeric_limits<int64_t>::max();
};
absl::StatusOr<StepRange> ParseStepRange(const std::string& text);

struct TraceSummary {
  int ranks = 0;
  int64_t events = 0;  // spans written
  int64_t first_step = -1, last_step = -1;
  int64_t clock_error_us = -1;
  int64_t dropped = 0;
};

// Writes the Chrome trace of `ranks`' spans whose step is in `steps`. FAILED_PRECONDITION when
// none is.
absl::StatusOr<TraceSummary> WriteChromeTrace(const std::vector<RankTrace>& ranks,
                                              const StepRange& steps, const std::string& job,
                                              std::ostream& out);

}  // namespace latchkey

#endif  // LATCHKEY_CLIENT_TRACE_FILE_H_
