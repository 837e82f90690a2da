// The coordinator's live status page, served on its HTTP port next to /metrics
// (docs/observability.md "Status page"):
//   GET /          every job: state, step/steps, loss, tokens/s, restarts
//   GET /jobs/ID   one job: SVG charts drawn here (no script, no CDN) of the loss and eval loss,
//                  the K/V all-reduces, the collective share and the peak memory per step, the
//                  latch audit, stalled ranks, the workers
// Both pages refresh themselves (meta refresh). Everything that comes from a user (job ids,
// names, reasons, messages, hosts) is HTML-escaped.
// Auth: with a token table the pages need a token of any role (every role may read), as a
// bearer token or the password of HTTP basic auth, checked by TokenTable::Find (constant time);
// without one (auth off, or the port binds loopback) they are open. /metrics never needs one.
// Thread-safety: thread-safe (the page keeps no state). A job page copies the job under one short
// lock (Coordinator::Snapshot) and never waits on it; the latch audit (the rows `latchkey audit`
// lists) is Coordinator::ReadAudit, read from the store with no coordinator lock held.
// Lifetime: `core` and `tokens` outlive the page.
#ifndef LATCHKEY_SERVER_STATUS_PAGE_H_
#define LATCHKEY_SERVER_STATUS_PAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/metrics_endpoint.h"
#include "server/coordinator.h"
#include "server/html_parts.h"
#include "server/security.h"

namespace latchkey {

// Whether an Authorization header value carries a token of `tokens` ("Bearer T", or
// "Basic base64(user:T)" with any user name).
bool StatusPageAuthorized(const TokenTable& tokens, absl::string_view authorization);

class StatusPage {
 public:
  // `tokens` null: the pages are open.
  StatusPage(Coordinator* core, std::shared_ptr<const TokenTable> tokens, int refresh_seconds = 5)
      : core_(core), tokens_(std::move(tokens)), refresh_seconds_(refresh_seconds) {}

  // The routes "/" and "/jobs/([^/]+)" for MetricsEndpoint.
  std::vector<HttpRoute> Routes();
  HttpResponse Index(const HttpRequest& request);
  HttpResponse Job(const HttpRequest& request);

 private:
  // 401 with a WWW-Authenticate challenge when the request lacks a valid token.
  bool Allowed(const HttpRequest& request, HttpResponse* denied) const;
  std::string Header(const std::string& title) const;
  // The job page's latch audit section: the newest latches, the policy changes, the events.
  std::string LatchAudit(const std::string& job_id, int64_t windows_published) const;

  Coordinator* core_;
  std::shared_ptr<const TokenTable> tokens_;
  int refresh_seconds_;
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_STATUS_PAGE_H_
