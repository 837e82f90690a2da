// Text and integer forms of the values the SQLite store keeps, and their checked inverses.
// Private to the SqliteStore (sqlite_*.cc). A stored value that does not parse is DATA_LOSS naming
// the row
// (`row`, e.g. "latch(3) of job job-000001"), never a default.
#ifndef LATCHKEY_SERVER_SQLITE_VALUES_H_
#define LATCHKEY_SERVER_SQLITE_VALUES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/states.h"

namespace latchkey {

absl::Status Corrupt(const std::string& row, const std::string& what);  // DATA_LOSS

std::string NoSyncText(const std::vector<bool>& mask);  // "0110"
absl::StatusOr<std::vector<bool>> NoSyncFromText(const std::string& row, const std::string& s);
std::string SplitText(const std::vector<int>& split);  // "5,3"; "" = even
absl::StatusOr<std::vector<int>> SplitFromText(const std::string& row, const std::string& s);
absl::StatusOr<KvMode> KvModeFromText(const std::string& row, const std::string& s);
absl::StatusOr<KvReducePolicy> KvReduceFromText(const std::string& row, const std::string& s);
absl::StatusOr<JobState> JobStateFromInt(const std::string& row, int64_t v);
absl::StatusOr<WorkerState> WorkerStateFromInt(const std::string& row, int64_t v);

// The mask of a spec's latchkey.no_sync as NoSyncText ("" when it has none).
std::string SpecNoSync(const std::string& spec_json);
// A spec's optimizer.params.lr; nullopt when it names none or is not JSON.
std::optional<double> SpecLr(const std::string& spec_json);
// DP * MB of a stored spec (world_size / tp * train_micro_batch_size_per_gpu, with the spec's
// defaults: world_size = tp, tp = 1, MB = 1); nullopt when the JSON is not an object or a value
// is not a positive integer.
std::optional<int64_t> SpecSamplesPerMicroBatch(const std::string& spec_json);

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_SQLITE_VALUES_H_
