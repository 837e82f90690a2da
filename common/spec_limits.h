// Limits a coordinator applies to submitted specs (docs/job-spec.md, "Limits"): a model-size
// budget and data roots that confine every path a spec names. Workers re-check the paths they
// open against the roots in LATCHKEY_DATA_ROOTS.
//
// Thread-safety: every function is pure and reentrant (the filesystem is read, never written).
#ifndef LATCHKEY_COMMON_SPEC_LIMITS_H_
#define LATCHKEY_COMMON_SPEC_LIMITS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/job_spec.h"

namespace latchkey {

// The exact parameter count of the GPTBigCode model `m` describes (lm_head tied to wte). It
// saturates at INT64_MAX instead of overflowing, so any ModelConfig is safe to pass.
int64_t ModelParameterCount(const ModelConfig& m);

struct SpecLimits {
  int64_t max_model_parameters = 20000000000;  // --max-model-parameters
  int max_world_size = 65536;                  // ranks of one job
  std::vector<std::string> data_roots;         // --data-root (repeatable); empty = unconfined
};

// INVALID_ARGUMENT naming the field when the spec's world size or model exceeds its limit, or a
// path it names
// (latchkey.data.tokens_file, latchkey.data.path_prefix, latchkey.data.blend[i].path_prefix,
// latchkey.data.cache_dir, latchkey.eval.tokens_file, latchkey.init_from,
// latchkey.checkpoint.dir) lies outside every data root.
absl::Status CheckSpecLimits(const JobSpec& spec, const SpecLimits& limits);

// OK when `roots` is empty or `path` lies inside one of them once symlinks are resolved (the
// realpath of the longest existing prefix, then the rest normalized), so `..` and symlinks that
// leave the roots are refused. INVALID_ARGUMENT "<field>: ..." otherwise.
absl::Status CheckPathUnderRoots(const std::string& field, const std::string& path,
                                 const std::vector<std::string>& roots);

// The environment variable holding the worker's data roots, colon-separated.
inline constexpr char kDataRootsEnv[] = "LATCHKEY_DATA_ROOTS";
// The roots LATCHKEY_DATA_ROOTS names (empty entries skipped); empty when it is unset.
std::vector<std::string> DataRootsFromEnv();
// CheckPathUnderRoots against DataRootsFromEnv(): what a worker calls before opening a path.
absl::Status CheckPathUnderEnvRoots(const std::string& field, const std::string& path);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_SPEC_LIMITS_H_
