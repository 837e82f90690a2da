// The on-disk cache of built sample indices (as Megatron caches its .npy indices): one file per
// index, named by the SHA-256 of a description of everything the index depends on.
//
//   file: "LKIDXC01" | u64 description length | description | u64 array count |
//         per array: u64 length, int64 values | SHA-256 (64 lower-case hex chars) of all before
//
// LoadOrBuild serialises the processes that share the folder with an flock on "<file>.lock":
// the first builds and writes the file (write to a temporary, then rename), the others wait and
// read it, so one rank builds and all read. A file whose checksum or description does not match
// is refused (never used) and rebuilt in place.
// Thread-safety: reentrant; concurrent callers (threads or processes) on one file serialise.
// Errors: the folder cannot be created or written (PERMISSION_DENIED / INTERNAL, naming it), or
// what `build` returns.
#ifndef LATCHKEY_WORKER_DATA_INDEX_CACHE_H_
#define LATCHKEY_WORKER_DATA_INDEX_CACHE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace latchkey {

using IndexArrays = std::vector<std::vector<int64_t>>;

struct CacheResult {
  IndexArrays arrays;
  std::string path;      // the cache file
  bool built = false;    // false: read from the file
  bool refused = false;  // an existing file failed its checksum or description and was rebuilt
};

absl::StatusOr<CacheResult> LoadOrBuildIndex(
    const std::string& dir, const std::string& description,
    const std::function<absl::StatusOr<IndexArrays>()>& build);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_DATA_INDEX_CACHE_H_
