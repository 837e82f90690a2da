#include "server/status_page.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/error_info.h"
#include "common/states.h"

namespace latchkey {
namespace {

// Rows of the latch audit and the event list shown (the newest).
constexpr int kAuditRows = 20;

// A measured value (a loss, a gradient norm) as "%.4f", or what it is when not finite: "NaN",
// "Inf" or "-Inf" (a diverged step's).
std::string Measure(double v) { return std::isfinite(v) ? FormatNumber(v) : NonFiniteName(v); }

// A step number that may be -1 for "none" (a resume step, the last checkpoint step): "–" then.
std::string StepOrNone(int64_t step) { return step >= 0 ? absl::StrCat(step) : "–"; }

// Bytes as MiB with two decimals ("-" when the rank reported none).
std::string MiB(std::optional<int64_t> bytes) {
  if (!bytes) return "-";
  return FormatNumber(static_cast<double>(*bytes) / (1 << 20), "%.2f");
}

std::string Time(absl::Time t) {
  if (t == absl::UnixEpoch()) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", t, absl::UTCTimeZone());
}

std::string StateBadge(JobState s) {
  const char* name = JobStateName(s);
  return absl::StrCat("<span class=\"state ", name, "\">", name, "</span>");
}

// Tokens per second of a completed step (the whole job's tokens over the slowest rank's time).
double TokensPerSecond(const CompletedStep& step) {
  return step.report.step_seconds > 0
             ? static_cast<double>(step.report.tokens) / step.report.step_seconds
             : 0.0;
}

HttpResponse Html(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.content_type = "text/html; charset=utf-8";
  r.body = std::move(body);
  return r;
}

const char kStyle[] =
    "body{font-family:sans-serif;margin:1.5em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0 1.5em}"
    "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;font-size:.9em}"
    "th{background:#f0f0f0}.state{padding:0 .4em;border-radius:.3em;background:#ddd}"
    ".running{background:#cde8ff}.succeeded{background:#c8f0c8}.failed{background:#ffc8c8}"
    ".recovering{background:#ffe7b0}.cancelled{background:#e0e0e0}"
    ".preempted{background:#e6e0ff}.suspended{background:#e0e0e0}"
    "#charts{display:flex;flex-wrap:wrap;gap:6px;margin:.5em 0}"
    "svg{background:#fafafa;border:1px solid #ddd}";

}  // namespace

bool StatusPageAuthorized(const TokenTable& tokens, absl::string_view authorization) {
  if (std::optional<std::string> bearer = BearerToken(authorization)) {
    return tokens.Find(*bearer).has_value();
  }
  absl::string_view v = absl::StripAsciiWhitespace(authorization);
  if (v.size() < 6 || !absl::EqualsIgnoreCase(v.substr(0, 6), "basic ")) return false;
  std::string decoded;
  if (!absl::Base64Unescape(absl::StripAsciiWhitespace(v.substr(6)), &decoded)) return false;
  const size_t colon = decoded.find(':');
  if (colon == std::string::npos) return false;
  return tokens.Find(absl::string_view(decoded).substr(colon + 1)).has_value();
}

namespace {

// The job's heading, counters, reasons and warnings.
std::string JobSummary(const JobView& view) {
  const JobRecord& rec = view.record;
  std::string out;
  absl::StrAppend(&out, "<p><a href=\"/\">all jobs</a></p><h1>job <span id=\"job-id\">",
                  HtmlEscape(rec.job_id), "</span> ", StateBadge(rec.state), "</h1>");
  // The accumulation steps windows run with now: a `latchkey update --gas` policy's, else the
  // current layout's (the spec's, or an elastic layout's that keeps the global batch).
  const int policy_gas = rec.policy.gradient_accumulation_steps;
  const int layout_gas =
      view.attempts.empty() ? 0 : view.attempts.back().gradient_accumulation_steps;
  const std::string gas =
      policy_gas > 0 ? absl::StrCat(policy_gas, " (policy generation ", rec.policy.generation, ")")
                     : absl::StrCat(layout_gas, " (the layout's)");
  absl::StrAppend(&out, "<p>step ", view.steps_completed, "/", view.steps, ", attempt ",
                  rec.attempt, ", restarts ", rec.restarts, "/", view.max_restarts, ", world ",
                  view.world_size, " (tp ", view.tp, " &times; dp ", view.dp, "; spec world ",
                  view.spec_world_size, "), <span id=\"gas\">gradient accumulation steps ", gas,
                  "</span>, last checkpoint step ", StepOrNone(rec.last_checkpoint_step),
                  ", submitted by ", rec.submitter.empty() ? "-" : HtmlEscape(rec.submitter),
                  ", updated ", Time(rec.update_time), "</p>");
  if (!rec.failure_reason.empty()) {
    absl::StrAppend(&out, "<p class=\"reason\"><b>reason:</b> ", HtmlEscape(rec.failure_reason),
                    "</p>");
  }
  if (!rec.last_recovery_reason.empty()) {
    absl::StrAppend(&out, "<p><b>last recovery:</b> ", HtmlEscape(rec.last_recovery_reason),
                    "</p>");
  }
  for (const std::string& w : rec.warnings) {
    absl::StrAppend(&out, "<p><b>warning:</b> ", HtmlEscape(w), "</p>");
  }
  // Every attempt with its layout: what `latchkey --json status` lists as attempts. The
  // accumulation steps are the layout's; a policy update (`latchkey update --gas`) changes the
  // windows', shown above and in the policy changes.
  absl::StrAppend(&out,
                  "<table id=\"attempts\"><tr><th>attempt</th><th>world</th><th>tp</th>"
                  "<th>dp</th><th>layout's gradient_accumulation_steps</th><th>resume_step</th>"
                  "<th>cause</th></tr>");
  for (const AttemptSummary& a : view.attempts) {
    absl::StrAppend(&out, "<tr><td>", a.attempt, "</td><td>", a.world, "</td><td>", a.tp,
                    "</td><td>", a.dp, "</td><td>", a.gradient_accumulation_steps, "</td><td>",
                    StepOrNone(a.resume_step), "</td><td>", HtmlEscape(a.cause), "</td></tr>");
  }
  absl::StrAppend(&out, "</table>");
  return out;
}

// One colour per rank (cycled).
const char* RankColor(int rank) {
  static const char* const kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd",
                                        "#8c564b", "#e377c2", "#7f7f7f", "#17becf"};
  return kColors[static_cast<size_t>(rank) % (sizeof(kColors) / sizeof(kColors[0]))];
}

// One series per rank of a per-rank value of the steps (`value` of a step and a rank, absent
// when the rank did not report it), scaled by `scale`.
template <typename Map>
std::vector<ChartSeries> PerRank(const std::vector<CompletedStep>& steps,
                                 Map CompletedStep::*per_rank, double scale) {
  std::map<int, ChartSeries> by_rank;
  for (const CompletedStep& s : steps) {
    for (const auto& [rank, v] : s.*per_rank) {
      ChartSeries& series = by_rank[rank];
      if (series.name.empty()) {
        series.name = absl::StrCat("rank ", rank);
        series.color = RankColor(rank);
      }
      series.x.push_back(static_cast<double>(s.report.step));
      series.y.push_back(static_cast<double>(v) * scale);
    }
  }
  std::vector<ChartSeries> out;
  for (auto& [rank, series] : by_rank) out.push_back(std::move(series));
  return out;
}

// The charts over `steps` (loss and eval loss, K/V all-reduces, collective share and peak
// memory per rank), and the last step's figures.
std::string StepCharts(const std::vector<CompletedStep>& steps) {
  ChartSeries loss{"loss", "#1f77b4", {}, {}};
  ChartSeries eval{"eval loss", "#d62728", {}, {}, ChartMarker::kDiamond, /*dashed=*/true};
  ChartSeries kv{"K/V all-reduces", "#2ca02c", {}, {}, ChartMarker::kSquare};
  for (const CompletedStep& s : steps) {
    const double x = static_cast<double>(s.report.step);
    loss.x.push_back(x);
    loss.y.push_back(s.report.loss);
    if (s.report.eval_loss) {
      eval.x.push_back(x);
      eval.y.push_back(*s.report.eval_loss);
    }
    kv.x.push_back(x);
    kv.y.push_back(static_cast<double>(s.report.kv_allreduce_calls));
  }
  std::string out = "<div id=\"charts\">";
  // The coordinator keeps the newest completed steps of a job in memory (for watchers): the
  // charts show those.
  const std::string span = absl::StrCat(" (newest ", steps.size(), " steps)");
  out += SvgChart("loss per step" + span, {loss, eval}, "loss");
  out += SvgChart("K/V all-reduces per step, rank 0" + span, {kv}, "all-reduces");
  out += SvgChart("collective share of step time per rank" + span,
                  PerRank(steps, &CompletedStep::rank_collective_share, 100.0), "% of step");
  out += SvgChart("peak memory per rank" + span,
                  PerRank(steps, &CompletedStep::rank_peak_memory_bytes, 1.0 / (1 << 20)), "MiB");
  // The straggler score (docs/fault-tolerance.md "Stragglers"): a slow rank's line stands above.
  out += SvgChart("compute per micro-batch per rank" + span,
                  PerRank(steps, &CompletedStep::rank_compute_per_micro_batch, 1000.0), "ms");
  out += "</div>";
  if (!steps.empty()) {
    const CompletedStep& last = steps.back();
    absl::StrAppend(
        &out, "<p>last step ", last.report.step, ": loss ", Measure(last.report.loss),
        ", grad_norm ", Measure(last.report.grad_norm), ", lr ",
        FormatNumber(last.report.lr, "%.3e"), ", ", FormatNumber(TokensPerSecond(last), "%.0f"),
        " tokens/s, ", FormatNumber(last.report.step_seconds, "%.3f"), " s, kv ",
        KvModeName(last.report.kv_mode), " x", last.report.kv_allreduce_calls, ", peak memory ",
        MiB(last.report.peak_memory_bytes), " MiB (largest rank)</p>");
  }
  return out;
}

std::string StalledRanks(const JobRecord& rec) {
  std::string out = "<h2>stalled ranks</h2>";
  if (rec.stalled.empty()) return out + "<p id=\"stalled\">none</p>";
  out +=
      "<table id=\"stalled\"><tr><th>rank</th><th>window</th><th>micro-batch</th>"
      "<th>where</th><th>seconds</th><th>attempt</th></tr>";
  for (const StalledRank& s : rec.stalled) {
    absl::StrAppend(&out, "<tr><td>", s.rank, "</td><td>", s.window, "</td><td>", s.micro_batch,
                    "</td><td>", HtmlEscape(s.where), "</td><td>", FormatNumber(s.seconds, "%.1f"),
                    "</td><td>", s.attempt, "</td></tr>");
  }
  return out + "</table>";
}

// The ranks named slow (docs/fault-tolerance.md "Stragglers") and the latest split.
std::string Stragglers(const JobView& view) {
  std::string out = "<h2>stragglers</h2>";
  if (!view.replica_micro_batches.empty()) {
    absl::StrAppend(&out, "<p id=\"split\">micro-batches per DP replica: ",
                    absl::StrJoin(view.replica_micro_batches, ", "), "</p>");
  }
  if (view.stragglers.empty()) return out + "<p id=\"stragglers\">none</p>";
  out +=
      "<table id=\"stragglers\"><tr><th>rank</th><th>host</th><th>slowdown</th>"
      "<th>since step</th></tr>";
  for (const StragglerInfo& s : view.stragglers) {
    absl::StrAppend(&out, "<tr><td>", s.rank, "</td><td>", HtmlEscape(s.host), "</td><td>",
                    FormatNumber(s.slowdown, "%.2f"), "x</td><td>", s.since_step, "</td></tr>");
  }
  return out + "</table>";
}

// `steps`: the newest completed steps; the last one gives each rank's peak memory.
std::string Workers(const JobView& view, const std::vector<CompletedStep>& steps) {
  std::string out =
      "<h2>workers</h2><table id=\"workers\"><tr><th>rank</th><th>worker</th><th>state</th>"
      "<th>tp rank</th><th>dp rank</th><th>host</th><th>steps reported</th>"
      "<th>last seen</th><th>peak memory MiB (last step)</th></tr>";
  for (const JobWorkerInfo& w : view.workers) {
    std::optional<int64_t> peak;
    if (!steps.empty()) {
      const auto& peaks = steps.back().rank_peak_memory_bytes;
      if (auto it = peaks.find(w.rank); it != peaks.end()) peak = it->second;
    }
    absl::StrAppend(&out, "<tr><td>", w.rank, "</td><td>", HtmlEscape(w.worker_id), "</td><td>",
                    WorkerStateName(w.state), "</td><td>", w.tp_rank, "</td><td>", w.dp_rank,
                    "</td><td>", HtmlEscape(w.host), "</td><td>", w.steps_reported, "</td><td>",
                    Time(w.last_seen), "</td><td class=\"peak-memory\">", MiB(peak), "</td></tr>");
  }
  return out + "</table>";
}

}  // namespace

std::vector<HttpRoute> StatusPage::Routes() {
  return {{"/", [this](const HttpRequest& r) { return Index(r); }},
          {"/jobs/([^/]+)", [this](const HttpRequest& r) { return Job(r); }}};
}

bool StatusPage::Allowed(const HttpRequest& request, HttpResponse* denied) const {
  if (tokens_ == nullptr || StatusPageAuthorized(*tokens_, request.authorization)) return true;
  *denied = Html(401,
                 "<!doctype html><title>latchkey: token needed</title><p>This status page "
                 "needs a latchkey token (any role): a bearer token, or the password of "
                 "basic auth.</p>\n");
  denied->headers.push_back({"WWW-Authenticate", "Basic realm=\"latchkey\", charset=\"UTF-8\""});
  return false;
}

std::string StatusPage::Header(const std::string& title) const {
  return absl::StrCat("<!doctype html><html><head><meta charset=\"utf-8\">",
                      "<meta http-equiv=\"refresh\" content=\"", refresh_seconds_, "\">", "<title>",
                      HtmlEscape(title), "</title><style>", kStyle, "</style></head><body>");
}

HttpResponse StatusPage::Index(const HttpRequest& request) {
  HttpResponse denied;
  if (!Allowed(request, &denied)) return denied;
  auto jobs = core_->ListJobs({}, 100);
  if (!jobs.ok()) return Html(503, HtmlEscape(std::string(jobs.status().message())));
  std::string out = Header("latchkey jobs");
  absl::StrAppend(&out, "<h1>latchkey jobs</h1><p>", jobs->size(),
                  " job(s), newest first; refreshes every ", refresh_seconds_, " s. ",
                  Time(absl::Now()), "</p>");
  out +=
      "<table id=\"jobs\"><tr><th>job</th><th>state</th><th>step</th><th>loss</th>"
      "<th>eval loss</th><th>tokens/s</th><th>K/V all-reduces (last step)</th>"
      "<th>restarts</th><th>world (tp&times;dp)</th><th>updated</th></tr>";
  for (const JobView& v : *jobs) {
    const std::string id = HtmlEscape(v.record.job_id);
    const std::optional<CompletedStep>& last = v.last_step;
    // The newest evaluation, which is not the last step's unless it evaluated.
    std::string eval = "-";
    if (v.last_eval && v.last_eval->report.eval_loss) {
      eval = absl::StrCat(Measure(*v.last_eval->report.eval_loss), " (step ",
                          v.last_eval->report.step, ")");
    }
    absl::StrAppend(
        &out, "<tr><td><a href=\"/jobs/", id, "\">", id, "</a></td><td>",
        StateBadge(v.record.state), "</td><td>", v.steps_completed, "/", v.steps, "</td><td>",
        last ? Measure(last->report.loss) : "-", "</td><td>", eval, "</td><td>",
        last ? FormatNumber(TokensPerSecond(*last), "%.0f") : "-", "</td><td>",
        last ? absl::StrCat(last->report.kv_allreduce_calls, " (", KvModeName(last->report.kv_mode),
                            ")")
             : "-",
        "</td><td>", v.record.restarts, "/", v.max_restarts, "</td><td>", v.world_size, " (", v.tp,
        "&times;", v.dp, ")</td><td>", Time(v.record.update_time), "</td></tr>");
  }
  out +=
      "</table><p>Metrics for Prometheus at <a href=\"/metrics\">/metrics</a>.</p></body></html>\n";
  return Html(200, std::move(out));
}

HttpResponse StatusPage::Job(const HttpRequest& request) {
  HttpResponse denied;
  if (!Allowed(request, &denied)) return denied;
  const std::string job_id = request.captures.empty() ? "" : request.captures[0];
  // One short copy under the coordinator's lock: the page never waits on the job.
  auto snapshot = core_->Snapshot(job_id);
  if (!snapshot.ok()) {
    const int code = snapshot.status().code() == absl::StatusCode::kNotFound ? 404 : 503;
    return Html(code, Header("latchkey: no such job") + "<h1>latchkey</h1><p>job " +
                          HtmlEscape(job_id) + ": " +
                          HtmlEscape(std::string(snapshot.status().message())) +
                          "</p><p><a href=\"/\">all jobs</a></p></body></html>\n");
  }
  const JobView& view = snapshot->job;
  std::string out = Header("latchkey job " + view.record.job_id);
  out += JobSummary(view);
  out += StepCharts(snapshot->steps);
  out += StalledRanks(view.record);
  out += Stragglers(view);
  out += Workers(view, snapshot->steps);
  out += LatchAudit(job_id, view.record.next_window);
  out += "</body></html>\n";
  return Html(200, std::move(out));
}

std::string StatusPage::LatchAudit(const std::string& job_id, int64_t windows_published) const {
  // The newest latches, the policy changes and the events: ReadAudit reads them off the
  // coordinator's lock, so a page never holds up the workers' calls behind disk reads.
  const int64_t from = std::max<int64_t>(0, windows_published - kAuditRows);
  auto audit = core_->ReadAudit(job_id, from, kAuditRows);
  std::string out = "<h2>latch audit</h2>";
  if (!audit.ok()) {
    absl::StrAppend(&out, "<p>", HtmlEscape(std::string(audit.status().message())), "</p>");
    return out;
  }
  absl::StrAppend(&out, "<p>", windows_published, " latch(es) published; the newest ",
                  audit->latches.size(), ":</p>");
  out +=
      "<table id=\"latches\"><tr><th>window</th><th>generation</th><th>micro-batches</th>"
      "<th>kv mode</th><th>reason</th><th>published</th></tr>";
  for (auto it = audit->latches.rbegin(); it != audit->latches.rend(); ++it) {
    const Latch& l = it->latch;
    // An uneven split (rebalancing) follows the window's n: "4 (6,2 per DP replica)".
    const std::string split =
        l.replica_micro_batches.empty()
            ? std::string()
            : absl::StrCat(" (", absl::StrJoin(l.replica_micro_batches, ","), " per DP replica)");
    absl::StrAppend(&out, "<tr><td>", l.window, "</td><td>", l.generation, "</td><td>", l.n, split,
                    "</td><td>", KvModeName(l.kv_mode), "</td><td>", HtmlEscape(l.reason),
                    "</td><td>", Time(it->publish_time), "</td></tr>");
  }
  out +=
      "</table><h3>policy changes</h3><table id=\"policy\"><tr><th>generation</th>"
      "<th>kv_reduce</th><th>gradient accumulation</th><th>first window</th><th>time</th>"
      "</tr>";
  for (const PolicyChangeRecord& c : audit->policy_changes) {
    // 0: the layout's own (the spec's), as the CLI's "gas=spec" says.
    const int gas = c.policy.gradient_accumulation_steps;
    absl::StrAppend(&out, "<tr><td>", c.policy.generation, "</td><td>",
                    KvReducePolicyName(c.policy.kv_reduce), "</td><td>",
                    gas > 0 ? absl::StrCat(gas) : std::string("spec"), "</td><td>", c.first_window,
                    "</td><td>", Time(c.change_time), "</td></tr>");
  }
  out +=
      "</table><h3>events</h3><table id=\"events\"><tr><th>time</th><th>attempt</th>"
      "<th>kind</th><th>message</th></tr>";
  const size_t first_event =
      audit->events.size() > kAuditRows ? audit->events.size() - kAuditRows : 0;
  for (size_t i = audit->events.size(); i-- > first_event;) {
    const JobEventRecord& e = audit->events[i];
    absl::StrAppend(&out, "<tr><td>", Time(e.time), "</td><td>", e.attempt, "</td><td>",
                    HtmlEscape(e.kind), "</td><td>", HtmlEscape(e.message), "</td></tr>");
  }
  out += "</table>";
  return out;
}

}  // namespace latchkey
