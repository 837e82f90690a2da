#include "worker/session/call_retry.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/connection_hint.h"
#include "proto/channel.h"
#include "proto/grpc_status.h"

namespace latchkey {

absl::Status RetryCall(const CallRetry& r,
                       const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  absl::Duration backoff = r.initial;
  const absl::Time start = r.clock->Now();
  absl::Time next_line = start + r.waiting_line_every;
  bool said = false;
  while (true) {
    grpc::ClientContext ctx;
    // gRPC measures its deadlines on the real clock, whatever the session's Clock says.
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + r.rpc_timeout));
    const grpc::Status st = call(&ctx);
    if (st.ok()) {
      *r.answered = true;
      return absl::OkStatus();
    }
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE && !*r.answered) {
      // TLS on one side only (or another CA): no retry helps; say what to do, as the CLI does.
      if (IsTlsMismatch(DiagnoseConnection(st.error_message(), r.tls))) {
        return absl::UnavailableError(ExplainUnavailable(st.error_message(), r.coordinator, r.tls));
      }
    }
    const absl::Status last = FromGrpcStatus(st);
    if (!IsRetryable(st.error_code())) return last;
    const absl::Time now = r.clock->Now();
    if (now - start > r.limit) {
      if (!r.joining) return last;
      return absl::Status(last.code(), absl::StrCat("no answer within the join timeout of ",
                                                    absl::FormatDuration(r.limit),
                                                    "; the last try: ", last.ToString()));
    }
    // Never silent, never noisy: a join says it waits, then how long so far every
    // waiting_line_every; the other calls say it once per session.
    if (r.joining ? !said : !r.said_retrying->exchange(true)) {
      said = true;
      std::cerr << "latchkey-worker: coordinator " << r.coordinator
                << " not answering, retrying for up to " << absl::FormatDuration(r.limit) << ": "
                << last.ToString() << std::endl;
    } else if (r.joining && r.waiting_line_every > absl::ZeroDuration() && now >= next_line) {
      std::cerr << "latchkey-worker: still waiting for coordinator " << r.coordinator
                << " to answer the join of job " << r.job_id << ": "
                << absl::FormatDuration(absl::Trunc(now - start, absl::Seconds(1)))
                << " so far, giving up after " << absl::FormatDuration(r.limit)
                << "; the last try: " << last.ToString() << std::endl;
      while (next_line <= now) next_line += r.waiting_line_every;
    }
    // No sleep past the limit: the last try is at it.
    if (!r.sleep(std::min(backoff, std::max(r.limit - (now - start), absl::Milliseconds(1))))) {
      return r.closed;
    }
    backoff = std::min(backoff * 2, r.max);
  }
}

}  // namespace latchkey
