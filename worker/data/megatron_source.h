// The training (or evaluation) samples of a Megatron indexed dataset or blend, in exactly
// Megatron-Core's order (docs/data.md "Megatron indexed datasets"): sample k of this source is
// sample k of Megatron's GPTDataset (one path_prefix) or BlendedDataset (a blend) built for the
// same seed, seq_length, split and number of samples: the same tokens, document crossings and
// epoch wrap. A stream position p reads sample p mod num_samples().
//
// Opening maps the files (megatron_index.h), then loads each dataset's indices from the cache
// folder or builds and caches them (index_cache.h). The folder is latchkey.data.cache_dir, else
// "latchkey-index-cache" beside the first dataset when that folder is writable, else
// "index-cache" under latchkey.checkpoint.dir, else under the system's temporary folder.
// Thread-safety: immutable after opening; Read is thread-safe.
// Errors: those of megatron_index.h and index_cache.h; INVALID_ARGUMENT naming
// latchkey.data.split when a dataset's split is empty or holds less than one sample, or naming
// latchkey.data.blend when the blend asks a dataset for more samples than it was built for.
#ifndef LATCHKEY_WORKER_DATA_MEGATRON_SOURCE_H_
#define LATCHKEY_WORKER_DATA_MEGATRON_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "common/spec_files.h"  // MegatronCacheDir: the cache folder
#include "worker/data/token_source.h"

namespace latchkey {

enum class MegatronSplit { kTrain = 0, kValidation = 1, kTest = 2 };

struct MegatronOpenInfo {
  int64_t cache_hits = 0;     // datasets whose indices were read from the cache
  int64_t cache_builds = 0;   // datasets whose indices were built (and written)
  int64_t cache_refused = 0;  // cache files refused (bad checksum or description) and rebuilt
};

// `num_samples`: the samples the indices are built for (latchkey.data.num_samples for training,
// latchkey.eval.samples for evaluation). `info`, when not null, says what the cache did.
absl::StatusOr<std::unique_ptr<TokenSource>> OpenMegatronSource(const JobSpec& spec,
                                                                MegatronSplit split,
                                                                int64_t num_samples,
                                                                MegatronOpenInfo* info = nullptr);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_DATA_MEGATRON_SOURCE_H_
