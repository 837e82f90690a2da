// `latchkey-worker --dump-samples FILE N`: what a rank trained on. Each rank writes
// "FILE.rank<R>" (R = its global rank), one JSON line per micro-batch for its first N
// micro-batches, in the order it ran them:
//
//   {"rank": R, "dp_rank": d, "tp_rank": t, "window": s, "micro_batch": m,
//    "positions": [p, ...], "samples": [k, ...], "tokens": [[id, ...], ...]}
//
// with one entry per row b: p the stream position (docs/data.md), k = p mod the source's sample
// count (for a Megatron dataset: Megatron's sample index), and the row's seq_len + 1 token ids
// as the forward read them. The file is flushed after each line, so a crash keeps what ran.
// Thread-safety: one thread (the training thread). Errors: the file cannot be written
// (PERMISSION_DENIED naming it).
#ifndef LATCHKEY_WORKER_DATA_SAMPLE_DUMP_H_
#define LATCHKEY_WORKER_DATA_SAMPLE_DUMP_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latchkey {

class SampleDump {
 public:
  // Truncates "path.rank<rank>".
  static absl::StatusOr<std::unique_ptr<SampleDump>> Open(const std::string& path, int rank,
                                                          int dp_rank, int tp_rank,
                                                          int64_t micro_batches);
  // Whether more micro-batches are still to be written.
  bool wants_more() const { return written_ < limit_; }
  // One micro-batch: rows[b] the positions, samples[b] their sample indices, tokens the rows'
  // seq_len + 1 ids back to back. Ignored once N micro-batches were written.
  absl::Status Record(int64_t window, int64_t micro_batch, const std::vector<int64_t>& positions,
                      const std::vector<int64_t>& samples, const int64_t* tokens, int row_len);

 private:
  SampleDump() = default;
  std::string path_;
  std::ofstream out_;
  int rank_ = 0, dp_rank_ = 0, tp_rank_ = 0;
  int64_t limit_ = 0, written_ = 0;
};

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_DATA_SAMPLE_DUMP_H_
