// The retry of a WorkerSession's unary calls (worker_session.h, "Resilience"): a deadline per
// try, capped exponential backoff while the code is retryable, up to a limit, and what the wait
// says on stderr.
//
// Thread-safety: RetryCall is reentrant; `answered` and `said_retrying` are shared by the
// session's threads (atomics).
#ifndef LATCHKEY_WORKER_SESSION_CALL_RETRY_H_
#define LATCHKEY_WORKER_SESSION_CALL_RETRY_H_

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace latchkey {

struct CallRetry {
  const Clock* clock = nullptr;  // the backoff and the limit are measured on it
  std::string coordinator;       // named in what is said
  std::string job_id;
  bool tls = false;  // whether the channel uses TLS (a mismatch is not retried)
  absl::Duration rpc_timeout;
  absl::Duration initial;  // first backoff, doubled up to `max`
  absl::Duration max;
  absl::Duration limit;  // no try starts after this long; the last error is returned
  // A Join: says it waits at its first failure and then every `waiting_line_every` (the address,
  // how long so far, the last error), and its error past `limit` names the limit. Other calls
  // say it once per session (`said_retrying`).
  bool joining = false;
  absl::Duration waiting_line_every = absl::Seconds(5);
  std::atomic<bool>* answered = nullptr;       // set once some call reached the coordinator
  std::atomic<bool>* said_retrying = nullptr;  // set once a retried call was said
  // Sleeps up to the duration; false when the session closed (RetryCall returns `closed`).
  std::function<bool(absl::Duration)> sleep;
  absl::Status closed;
};

// `call` (given a context with its deadline) until it succeeds, fails with a code that is not
// retried, or `r.limit` has passed. Before any call of the session reached the coordinator, a
// TLS mismatch is UNAVAILABLE with the CLI's explanation at once.
absl::Status RetryCall(const CallRetry& r,
                       const std::function<grpc::Status(grpc::ClientContext*)>& call);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_SESSION_CALL_RETRY_H_
