// A collective that failed where no Status can be returned (inside autograd: the TP layers'
// forward/backward all-reduces) is thrown as a CollectiveError carrying the Status, so the
// worker's top loop (worker/runner) turns it back into the same Status code: DEADLINE_EXCEEDED
// for a timeout, UNAVAILABLE for a vanished peer. Any other exception reaching the top loop is a
// bug (INTERNAL).
#ifndef LATCHKEY_WORKER_COMM_COLLECTIVE_ERROR_H_
#define LATCHKEY_WORKER_COMM_COLLECTIVE_ERROR_H_

#include <stdexcept>
#include <string>

#include "absl/status/status.h"

namespace latchkey::comm {

class CollectiveError : public std::runtime_error {
 public:
  explicit CollectiveError(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

}  // namespace latchkey::comm

#endif  // LATCHKEY_WORKER_COMM_COLLECTIVE_ERROR_H_
