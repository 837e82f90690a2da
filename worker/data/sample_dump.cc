#include "worker/data/sample_dump.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace latchkey {

absl::StatusOr<std::unique_ptr<SampleDump>> SampleDump::Open(const std::string& path, int rank,
                                                             int dp_rank, int tp_rank,
                                                             int64_t micro_batches) {
  std::unique_ptr<SampleDump> d(new SampleDump());
  d->path_ = absl::StrCat(path, ".rank", rank);
  d->out_.open(d->path_, std::ios::trunc);
  if (!d->out_) {
    return absl::PermissionDeniedError(
        absl::StrCat("--dump-samples: cannot write '", d->path_, "'"));
  }
  d->rank_ = rank;
  d->dp_rank_ = dp_rank;
  d->tp_rank_ = tp_rank;
  d->limit_ = micro_batches;
  return d;
}

absl::Status SampleDump::Record(int64_t window, int64_t micro_batch,
                                const std::vector<int64_t>& positions,
                                const std::vector<int64_t>& samples, const int64_t* tokens,
                                int row_len) {
  if (!wants_more()) return absl::OkStatus();
  std::string line =
      absl::StrCat("{\"rank\":", rank_, ",\"dp_rank\":", dp_rank_, ",\"tp_rank\":", tp_rank_,
                   ",\"window\":", window, ",\"micro_batch\":", micro_batch, ",\"positions\":[",
                   absl::StrJoin(positions, ","), "],\"samples\":[", absl::StrJoin(samples, ","),
                   "],\"tokens\":[");
  for (size_t b = 0; b < positions.size(); ++b) {
    const int64_t* row = tokens + b * row_len;
    absl::StrAppend(&line, b == 0 ? "[" : ",[",
                    absl::StrJoin(std::vector<int64_t>(row, row + row_len), ","), "]");
  }
  line += "]}\n";
  out_ << line;
  out_.flush();
  if (!out_)
    return absl::DataLossError(absl::StrCat("--dump-samples: short write to '", path_, "'"));
  ++written_;
  return absl::OkStatus();
}

}  // namespace latchkey
