// The Megatron side of `latchkey.data` and `latchkey.eval` (docs/job-spec.md, docs/data.md):
// parsing of {"format": "megatron", ...} and its canonical JSON. Used by job_spec.cc and
// job_spec_json.cc only; everything else reads the parsed DataConfig.
//
// Thread-safety: pure and reentrant. Errors: INVALID_ARGUMENT "<field.path>: <reason>".
#ifndef LATCHKEY_COMMON_JOB_SPEC_DATA_H_
#define LATCHKEY_COMMON_JOB_SPEC_DATA_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/job_spec.h"
#include "common/json_reader.h"
#include "nlohmann/json.hpp"

namespace latchkey {

// `value` resolved against `base_dir` when relative, made absolute and normal. Refuses an empty
// value, naming `field`.
absl::Status ResolveSpecPath(const std::string& field, const std::string& base_dir,
                             std::string* value);

// Reads the megatron keys of `latchkey.data` (format already read as "megatron"): path_prefix
// or blend, split, seed (default `default_seed`), cache_dir, num_samples. Leaves num_samples 0
// when absent (ResolveMegatronSamples sets it once the layout is known).
absl::Status ParseMegatronData(JsonObjectReader& s, const std::string& base_dir,
                               uint64_t default_seed, DataConfig* d);

// The default num_samples (steps * micro-batches per rank over those steps * DP * MB) when the
// spec gave none, and the cross-field checks of latchkey.eval.split against the data.
absl::Status ResolveMegatronData(JobSpec* spec);

// The canonical JSON of a megatron `latchkey.data` (every field explicit).
nlohmann::json MegatronDataToJson(const DataConfig& d);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_JOB_SPEC_DATA_H_
