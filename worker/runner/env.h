// Integer settings from the environment (RANK, WORLD_SIZE, ...), with the variable named in
// the error.
#ifndef LATCHKEY_WORKER_RUNNER_ENV_H_
#define LATCHKEY_WORKER_RUNNER_ENV_H_

#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"

namespace latchkey {

inline absl::StatusOr<int> EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != 0 || x < 0) {
    return absl::InvalidArgumentError(std::string(name) + ": '" + v +
                                      "' is not a non-negative integer");
  }
  return static_cast<int>(x);
}

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_RUNNER_ENV_H_
