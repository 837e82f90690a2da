#include "server/sqlite_values.h"

#include <cstdint>
#include <initializer_list>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace latchkey {

std::string NoSyncText(const std::vector<bool>& mask) {
  std::string s;
  for (bool b : mask) s.push_back(b ? '1' : '0');
  return s;
}

absl::Status Corrupt(const std::string& row, const std::string& what) {
  return absl::DataLossError(absl::StrCat("stored ", row, ": ", what));
}

absl::StatusOr<std::vector<bool>> NoSyncFromText(const std::string& row, const std::string& s) {
  std::vector<bool> mask;
  for (char c : s) {
    if (c != '0' && c != '1')
      return Corrupt(row, absl::StrCat("no_sync '", s, "' is not 0s and 1s"));
    mask.push_back(c == '1');
  }
  return mask;
}

std::string SplitText(const std::vector<int>& split) { return absl::StrJoin(split, ","); }

absl::StatusOr<std::vector<int>> SplitFromText(const std::string& row, const std::string& s) {
  std::vector<int> split;
  if (s.empty()) return split;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int c = 0;
    if (!absl::SimpleAtoi(part, &c) || c < 1) {
      return Corrupt(
          row, absl::StrCat("replica_micro_batches '", s, "' is not a list of positive counts"));
    }
    split.push_back(c);
  }
  return split;
}

absl::StatusOr<KvMode> KvModeFromText(const std::string& row, const std::string& s) {
  std::optional<KvMode> mode = ParseKvMode(s);
  if (!mode) return Corrupt(row, absl::StrCat("kv_mode '", s, "' is not a K/V mode"));
  return *mode;
}

absl::StatusOr<KvReducePolicy> KvReduceFromText(const std::string& row, const std::string& s) {
  std::optional<KvReducePolicy> policy = ParseKvReducePolicy(s);
  if (!policy) return Corrupt(row, absl::StrCat("kv_reduce '", s, "' is not a K/V policy"));
  return *policy;
}

absl::StatusOr<JobState> JobStateFromInt(const std::string& row, int64_t v) {
  for (JobState s : kAllJobStates) {
    if (static_cast<int64_t>(s) == v) return s;
  }
  return Corrupt(row, absl::StrCat("job state ", v, " is not a state"));
}

absl::StatusOr<WorkerState> WorkerStateFromInt(const std::string& row, int64_t v) {
  for (WorkerState s : kAllWorkerStates) {
    if (static_cast<int64_t>(s) == v) return s;
  }
  return Corrupt(row, absl::StrCat("worker state ", v, " is not a state"));
}

std::string SpecNoSync(const std::string& spec_json) {
  auto spec = nlohmann::json::parse(spec_json, nullptr, false);
  if (!spec.is_object() || !spec.contains("latchkey")) return "";
  const nlohmann::json& latchkey = spec["latchkey"];
  if (!latchkey.is_object() || !latchkey.contains("no_sync")) return "";
  const nlohmann::json& mask = latchkey["no_sync"];
  std::string out;
  if (!mask.is_array()) return out;
  for (const auto& b : mask) {
    if (!b.is_boolean()) return "";
    out.push_back(b.get<bool>() ? '1' : '0');
  }
  return out;
}

std::optional<double> SpecLr(const std::string& spec_json) {
  auto spec = nlohmann::json::parse(spec_json, nullptr, false);
  if (!spec.is_object()) return std::nullopt;
  const nlohmann::json* lr = &spec;
  for (const char* key : {"optimizer", "params", "lr"}) {
    if (!lr->is_object() || !lr->contains(key)) return std::nullopt;
    lr = &(*lr)[key];
  }
  if (!lr->is_number()) return std::nullopt;
  return lr->get<double>();
}

std::optional<int64_t> SpecSamplesPerMicroBatch(const std::string& spec_json) {
  auto spec = nlohmann::json::parse(spec_json, nullptr, false);
  if (!spec.is_object()) return std::nullopt;
  // The value at `path`, `fallback` when a key on the way is absent, 0 when it is not a number.
  const auto at = [&](std::initializer_list<const char*> path, int64_t fallback) -> int64_t {
    const nlohmann::json* v = &spec;
    for (const char* key : path) {
      if (!v->is_object() || !v->contains(key)) return fallback;
      v = &(*v)[key];
    }
    return v->is_number_integer() ? v->get<int64_t>() : 0;
  };
  const int64_t tp = at({"tensor_parallel", "autotp_size"}, 1);
  const int64_t world = at({"latchkey", "world_size"}, tp);
  const int64_t mb = at({"train_micro_batch_size_per_gpu"}, 1);
  if (tp < 1 || world < tp || world % tp != 0 || mb < 1) return std::nullopt;
  return world / tp * mb;
}

}  // namespace latchkey
