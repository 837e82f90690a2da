// The process's count of dropped checkpoint saves (save_failures.h).
#include "worker/checkpoint/save_failures.h"

#include <atomic>

namespace latchkey {
namespace {

std::atomic<int64_t>& Failures() {
  static std::atomic<int64_t> count{0};
  return count;
}

}  // namespace

int64_t CountCheckpointSaveFailure() { return Failures().fetch_add(1) + 1; }

int64_t CheckpointSaveFailures() { return Failures().load(); }

}  // namespace latchkey
