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
#include "server/security.h"

namespace latchkey {

// &, <, >, " and ' as entities.
std::string HtmlEscape(absl::string_view text);

// Whether an Authorization header value carries a token of `tokens` ("Bearer T", or
// "Basic base64(user:T)" with any user name).
bool StatusPageAuthorized(const TokenTable& tokens, absl::string_view authorization);

// How a series marks its points (the legend shows the same marker).
enum class ChartMarker { kCircle, kSquare, kDiamond };

// One chart series: y per x (x = step), drawn as a polyline with a marker per point.
struct ChartSeries {
  std::string name;
  std::string color;  // CSS color
  std::vector<double> x;
  std::vector<double> y;
  ChartMarker marker = ChartMarker::kCircle;
  bool dashed = false;  // a dashed line (a second kind of series on the same chart)
};
// A self-contained <svg> line chart: the title, under it a legend (one entry per series, wrapped
// to the width), the plot with ticks at "nice" values labelled on both axes (step on x, value on
// y, `y_label` along the y axis), a light grid; "no data yet" when no series has a point.
// Text boxes never overlap: the title, the legend lines and the plot each have their own band.
std::string SvgChart(const std::string& title, const std::vector<ChartSeries>& series,
                     const std::string& y_label = "");

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
