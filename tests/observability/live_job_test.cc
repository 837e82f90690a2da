// One real job under `latchkey up` (coordinator + 2 workers, TP 2, checkpoints and evaluation
// on), scraped every second by a real Prometheus that loads deploy/prometheus/rules:
//  - every PromQL expression of every Grafana dashboard panel (variables widened: $job and
//    $instance to ".*", $__rate_interval to 1m) returns a non-empty result; the panels of the
//    status page's charts (loss, eval loss, lr, collective share, peak memory) one value per rank;
//  - every recording rule returns a non-empty result, every rule evaluates without error, and
//    no alert is pending or firing on the healthy job (K/V all-reduces exactly as planned);
//  - the coordinator's status page, rendered by headless Chromium, shows the job and its charts;
//    laid out by Chromium, no two of its text boxes overlap and every chart has labelled ticks
//    (the screenshot is kept under the build's test output folder).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "tests/support/free_port.h"
#include "tests/support/launch.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tools.h"

#ifndef LATCHKEY_TEST_OUTPUT_DIR
#define LATCHKEY_TEST_OUTPUT_DIR "."
#endif

namespace latchkey::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

int PortFrom(const std::string& file) {
  const auto j = nlohmann::json::parse(ReadText(file), nullptr, false);
  return j.is_discarded() ? 0 : j.value("metrics_port", 0);
}

// The shared run: started once for the suite, stopped at its end.
struct LiveJob {
  std::string dir;
  std::string job_id;
  int up_pid = -1;
  int prom_pid = -1;
  int coordinator_port = 0;
  int prom_port = 0;
  std::string error;  // why it could not start ("" when it runs)
};
LiveJob* live = nullptr;

// Prometheus's instant query; the parsed "data" (null on failure, with `why`).
nlohmann::json Query(const std::string& expr, std::string* why) {
  httplib::Client c("127.0.0.1", live->prom_port);
  c.set_read_timeout(10);
  auto res = c.Post("/api/v1/query", httplib::Params{{"query", expr}});
  if (!res) {
    *why = "no answer";
    return nullptr;
  }
  const auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") {
    *why = res->body;
    return nullptr;
  }
  return j["data"];
}

nlohmann::json GetJson(const std::string& path) {
  httplib::Client c("127.0.0.1", live->prom_port);
  c.set_read_timeout(10);
  auto res = c.Get(path.c_str());
  if (!res) return nullptr;
  const auto j = nlohmann::json::parse(res->body, nullptr, false);
  return j.is_discarded() ? nullptr : j;
}

// Grafana's variables widened to what "All" means, the rate interval to 1m.
std::string Widen(std::string expr) {
  expr = std::regex_replace(expr, std::regex("\\$__rate_interval"), "1m");
  expr = std::regex_replace(expr, std::regex("\\$\\{?(job|instance)\\}?"), ".*");
  return expr;
}

void StartLiveJob(LiveJob* j) {
  j->dir = MakeTempDir("obs-live");
  const std::string& dir = j->dir;
  {
    std::vector<uint16_t> tokens(4 * 32 + 1);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 37) % 256);
    std::ofstream(dir + "/eval.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()),
               static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
  }
  SpecParams p;
  p.steps = 100000;  // runs until the suite stops it
  p.gas = 4;
  p.tp = 2;
  p.world_size = 2;
  p.extra_latchkey = {{"checkpoint", {{"dir", "ckpt"}, {"every_steps", 4}, {"keep", 2}}},
                      {"eval", {{"tokens_file", "eval.bin"}, {"every_steps", 4}, {"samples", 2}}}};
  std::ofstream(dir + "/spec.json") << SpecJson(p);
  fs::create_directories(dir + "/config");
  j->up_pid = StartProcess(
      {LATCHKEY_CLI_BIN, "up", "--spec", dir + "/spec.json", "--run-dir", dir + "/run"},
      {"XDG_CONFIG_HOME=" + dir + "/config"}, dir + "/up.log");
  // Both workers serve metrics and have trained past a checkpoint and an evaluation.
  const std::string steps = WaitForFile(
      dir + "/run/steps-1.jsonl",
      [](const std::string& t) { return std::count(t.begin(), t.end(), '\n') >= 10; },
      seconds(180));
  const std::string log = ReadText(dir + "/up.log");
  std::smatch m;
  if (!std::regex_search(log, m, std::regex("\njob +([^ ]+) "))) {
    j->error = "no job line from latchkey up:\n" + log;
    return;
  }
  j->job_id = m[1];
  j->coordinator_port = PortFrom(dir + "/run/ports.json");
  const int w0 = PortFrom(dir + "/run/worker-0.port.json");
  const int w1 = PortFrom(dir + "/run/worker-1.port.json");
  if (j->coordinator_port <= 0 || w0 <= 0 || w1 <= 0 ||
      std::count(steps.begin(), steps.end(), '\n') < 10) {
    j->error = "the job did not get going:\n" + log;
    return;
  }
  // Prometheus: the repository's rules, the three processes as static targets of job latchkey.
  const std::string rules = SourceDir() + "/deploy/prometheus/rules";
  fs::create_directories(dir + "/prom");
  std::ofstream(dir + "/prom/prometheus.yml")
      << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
      << "rule_files: ['" << rules << "/recording.yml', '" << rules << "/alerts.yml']\n"
      << "scrape_configs:\n  - job_name: latchkey\n    static_configs:\n"
      << "      - targets: ['127.0.0.1:" << j->coordinator_port << "']\n"
      << "        labels: {component: coordinator}\n"
      << "      - targets: ['127.0.0.1:" << w0 << "', '127.0.0.1:" << w1 << "']\n"
      << "        labels: {component: worker}\n";
  j->prom_port = FreePort();
  j->prom_pid = StartProcess({"prometheus", "--config.file=" + dir + "/prom/prometheus.yml",
                              "--storage.tsdb.path=" + dir + "/prom/data",
                              "--web.listen-address=127.0.0.1:" + std::to_string(j->prom_port)},
                             {}, dir + "/prom/prometheus.log");
  // Every target up and scraped for long enough that 1m rates have several samples.
  std::string why;
  for (int i = 0; i < 60; ++i) {
    std::this_thread::sleep_for(seconds(1));
    const nlohmann::json d = Query("min(count_over_time(up{job=\"latchkey\"}[1m]))", &why);
    const nlohmann::json up = Query("sum(up{job=\"latchkey\"})", &why);
    if (d.is_null() || up.is_null() || d["result"].empty() || up["result"].empty()) continue;
    if (std::stod(up["result"][0]["value"][1].get<std::string>()) == 3 &&
        std::stod(d["result"][0]["value"][1].get<std::string>()) >= 8) {
      return;
    }
  }
  j->error = "Prometheus did not scrape the three targets: " + why + "\n" +
             ReadText(dir + "/prom/prometheus.log");
}

class LiveJobTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    live = new LiveJob();
    if (!HaveTool("prometheus")) {
      live->error = "skip: prometheus";
      return;
    }
    StartLiveJob(live);
  }
  static void TearDownTestSuite() {
    if (live->prom_pid > 0) {
      kill(live->prom_pid, SIGTERM);
      WaitProcess(live->prom_pid, seconds(20));
    }
    if (live->up_pid > 0) {
      kill(live->up_pid, SIGINT);  // cancels the job and stops its processes
      WaitProcess(live->up_pid, seconds(60));
    }
    if (std::getenv("LATCHKEY_KEEP_TEST_DIRS") == nullptr) fs::remove_all(live->dir);
    delete live;
    live = nullptr;
  }
  void SetUp() override {
    if (live->error.rfind("skip: ", 0) == 0) {
      LATCHKEY_REQUIRE_TOOL(live->error.substr(6), "Debian package prometheus");
    }
    ASSERT_EQ(live->error, "");
  }
};

// Every panel's targets, rows' nested panels included.
void CollectTargets(const nlohmann::json& panels, const std::string& dashboard,
                    std::vector<std::pair<std::string, std::string>>* out) {
  for (const auto& panel : panels) {
    if (panel.contains("panels")) CollectTargets(panel["panels"], dashboard, out);
    for (const auto& t : panel.value("targets", nlohmann::json::array())) {
      out->push_back({dashboard + " / " + panel.value("title", "?"), t.value("expr", "")});
    }
  }
}

TEST_F(LiveJobTest, EveryDashboardQueryReturnsData) {
  std::vector<std::pair<std::string, std::string>> queries;
  std::set<std::string> dashboards;
  for (const auto& entry : fs::directory_iterator(SourceDir() + "/deploy/grafana/dashboards")) {
    if (entry.path().extension() != ".json") continue;
    const auto d = nlohmann::json::parse(ReadText(entry.path().string()), nullptr, false);
    ASSERT_FALSE(d.is_discarded()) << entry.path();
    dashboards.insert(d.value("uid", ""));
    std::set<std::string> vars;
    for (const auto& v : d["templating"]["list"]) vars.insert(v.value("name", ""));
    EXPECT_EQ(vars, (std::set<std::string>{"datasource", "job", "instance"})) << entry.path();
    CollectTargets(d["panels"], d.value("title", ""), &queries);
  }
  EXPECT_EQ(dashboards, (std::set<std::string>{"latchkey-jobs", "latchkey-collectives",
                                               "latchkey-latches", "latchkey-health"}));
  ASSERT_GE(queries.size(), 30u);
  for (const auto& [where, expr] : queries) {
    ASSERT_FALSE(expr.empty()) << where;
    EXPECT_TRUE(Has(expr, "$job") && Has(expr, "$instance")) << where << ": " << expr;
    std::string why;
    const nlohmann::json data = Query(Widen(expr), &why);
    ASSERT_FALSE(data.is_null()) << where << ": " << Widen(expr) << "\n" << why;
    EXPECT_FALSE(data["result"].empty()) << where << ": " << Widen(expr);
  }
}

// The panels that match the status page's charts (loss, eval loss, lr, collective share, peak
// memory): one series per worker rank, each a measured value (positive; a share below 1).
TEST_F(LiveJobTest, StatusPagePanelsReturnEachRanksValues) {
  const auto d = nlohmann::json::parse(
      ReadText(SourceDir() + "/deploy/grafana/dashboards/latchkey-jobs.json"), nullptr, false);
  ASSERT_FALSE(d.is_discarded());
  std::vector<std::pair<std::string, std::string>> queries;
  CollectTargets(d["panels"], "jobs", &queries);
  const std::map<std::string, double> upper = {
      {"jobs / Loss and eval loss", 1e3},
      {"jobs / Learning rate", 1.0},
      {"jobs / Collective share of step time (each rank)", 1.0},
      {"jobs / Peak memory (each rank, last step)", 1e12}};
  std::map<std::string, int> checked;
  for (const auto& [where, expr] : queries) {
    const auto bound = upper.find(where);
    if (bound == upper.end()) continue;
    ++checked[where];
    std::string why;
    const nlohmann::json data = Query(Widen(expr), &why);
    ASSERT_FALSE(data.is_null()) << where << ": " << why;
    ASSERT_EQ(data["result"].size(), 2u) << where << ": " << expr << "\n" << data.dump();
    for (const auto& r : data["result"]) {
      const double v = std::stod(r["value"][1].get<std::string>());
      EXPECT_GT(v, 0.0) << where << ": " << r.dump();
      EXPECT_LT(v, bound->second) << where << ": " << r.dump();
    }
  }
  EXPECT_EQ(checked,
            (std::map<std::string, int>{{"jobs / Loss and eval loss", 2},
                                        {"jobs / Learning rate", 1},
                                        {"jobs / Collective share of step time (each rank)", 1},
                                        {"jobs / Peak memory (each rank, last step)", 1}}));
}

TEST_F(LiveJobTest, EveryRecordingRuleReturnsDataAndNoAlertIsActive) {
  const std::string text = ReadText(SourceDir() + "/deploy/prometheus/rules/recording.yml");
  std::vector<std::string> records;
  const std::regex re("- record: ([^\\s]+)");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    records.push_back((*it)[1]);
  }
  ASSERT_GE(records.size(), 10u);
  for (const std::string& name : records) {
    std::string why;
    nlohmann::json data;
    for (int i = 0; i < 20; ++i) {  // rules run every second
      data = Query(name, &why);
      if (!data.is_null() && !data["result"].empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    ASSERT_FALSE(data.is_null()) << name << ": " << why;
    EXPECT_FALSE(data["result"].empty()) << name;
  }
  const nlohmann::json rules = GetJson("/api/v1/rules");
  ASSERT_FALSE(rules.is_null());
  int checked = 0;
  for (const auto& group : rules["data"]["groups"]) {
    for (const auto& rule : group["rules"]) {
      ++checked;
      EXPECT_EQ(rule.value("health", ""), "ok") << rule.dump();
      if (rule.value("type", "") == "alerting") {
        EXPECT_EQ(rule.value("state", ""), "inactive") << rule.dump();
      }
    }
  }
  EXPECT_EQ(checked, static_cast<int>(records.size()) + 6);
  // The healthy job's K/V all-reduces are exactly what its latches planned: coalesced
  // (latchkey.kv_reduce auto), one per step on each rank.
  std::string why;
  const nlohmann::json per_step =
      Query("job:latchkey_kv_allreduce_per_step:ratio_rate5m{mode=\"coalesced\"}", &why);
  ASSERT_FALSE(per_step.is_null()) << why;
  ASSERT_EQ(per_step["result"].size(), 1u) << per_step.dump();
  EXPECT_NEAR(std::stod(per_step["result"][0]["value"][1].get<std::string>()), 1.0, 1e-9);
  const nlohmann::json excess = Query(
      "sum by (instance, mode) (latchkey_kv_allreduce_total) - sum by (instance, mode) "
      "(latchkey_kv_allreduce_planned_total)",
      &why);
  ASSERT_FALSE(excess.is_null()) << why;
  EXPECT_EQ(excess["result"].size(), 6u) << excess.dump();  // 2 workers x 3 modes
  for (const auto& r : excess["result"]) {
    EXPECT_EQ(r["value"][1].get<std::string>(), "0") << r.dump();
  }
}

TEST_F(LiveJobTest, StatusPageInHeadlessChromium) {
  LATCHKEY_REQUIRE_TOOL("chromium", "Debian package chromium");
  const std::string base = "http://127.0.0.1:" + std::to_string(live->coordinator_port);
  const std::string page = base + "/jobs/" + live->job_id;
  const std::string profile = live->dir + "/chromium";
  const std::vector<std::string> chromium = {"chromium",
                                             "--headless",
                                             "--no-sandbox",
                                             "--disable-gpu",
                                             "--user-data-dir=" + profile,
                                             "--window-size=1280,1600"};
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = chromium;
    args.insert(args.end(), extra.begin(), extra.end());
    return RunAndCapture(args, seconds(60));
  };
  // The DOM as the browser built it: the job, its state and the charts with their points.
  const Captured dom = run({"--dump-dom", page});
  ASSERT_EQ(dom.exit_code, 0) << dom.output;
  EXPECT_TRUE(Has(dom.output, "<span id=\"job-id\">" + live->job_id + "</span>")) << dom.output;
  EXPECT_TRUE(Has(dom.output, ">running</span>")) << dom.output;
  std::smatch m;
  const std::regex loss("data-series=\"loss\"[^>]* points=\"([^\"]+)\"");
  ASSERT_TRUE(std::regex_search(dom.output, m, loss)) << dom.output;
  EXPECT_GE(std::count(m[1].first, m[1].second, ','), 8) << m[1];  // one x,y pair per step
  const std::regex eval("data-series=\"eval loss\"[^>]* points=\"([^\"]+)\"");
  ASSERT_TRUE(std::regex_search(dom.output, m, eval)) << dom.output;
  EXPECT_GE(std::count(m[1].first, m[1].second, ','), 2) << m[1];  // evaluated every 4 steps
  EXPECT_TRUE(Has(dom.output, "data-series=\"K/V all-reduces\"")) << dom.output;
  EXPECT_TRUE(Has(dom.output, "<table id=\"workers\">")) << dom.output;
  EXPECT_TRUE(Has(dom.output, "<table id=\"latches\">")) << dom.output;
  EXPECT_TRUE(Has(dom.output, "http-equiv=\"refresh\"")) << dom.output;
  // The list links the job.
  const Captured index = run({"--dump-dom", base + "/"});
  ASSERT_EQ(index.exit_code, 0) << index.output;
  EXPECT_TRUE(Has(index.output, "href=\"/jobs/" + live->job_id + "\"")) << index.output;
  // The screenshot: a PNG of the window's size with real content (a blank page compresses to
  // a few KiB).
  const std::string png = live->dir + "/status.png";
  const Captured shot = run({"--screenshot=" + png, page});
  ASSERT_EQ(shot.exit_code, 0) << shot.output;
  const std::string bytes = ReadText(png);
  ASSERT_GT(bytes.size(), 24u) << shot.output;
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  auto be32 = [&](size_t at) {
    return (static_cast<uint32_t>(static_cast<unsigned char>(bytes[at])) << 24) |
           (static_cast<uint32_t>(static_cast<unsigned char>(bytes[at + 1])) << 16) |
           (static_cast<uint32_t>(static_cast<unsigned char>(bytes[at + 2])) << 8) |
           static_cast<uint32_t>(static_cast<unsigned char>(bytes[at + 3]));
  };
  EXPECT_EQ(be32(16), 1280u);  // IHDR width
  EXPECT_EQ(be32(20), 1600u);  // IHDR height
  EXPECT_GT(bytes.size(), 20000u) << "a near-empty screenshot";
  std::printf("status page screenshot: %s (%zu bytes)\n", png.c_str(), bytes.size());
}

// Run in the page once it has loaded: every text's box as Chromium laid it out (HTML text runs
// through a Range, SVG <text> as an element), and per chart its title, tick labels, series and
// markers; the result as JSON in a <pre id="latchkey-layout">.
const char kLayoutScript[] = R"js(
window.addEventListener('load', function () {
  var out = {texts: [], charts: []};
  function box(r) { return {x: r.left, y: r.top, w: r.width, h: r.height}; }
  var seen = new Set();
  var walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (var n = walker.nextNode(); n; n = walker.nextNode()) {
    var text = n.textContent.trim();
    if (!text) continue;
    var parent = n.parentElement;
    if (parent instanceof SVGElement) {
      if (seen.has(parent)) continue;
      seen.add(parent);
      var b = box(parent.getBoundingClientRect());
      b.t = parent.textContent.trim();
      out.texts.push(b);
      continue;
    }
    var range = document.createRange();
    range.selectNodeContents(n);
    var rects = range.getClientRects();
    for (var i = 0; i < rects.length; i++) {
      if (rects[i].width <= 0 || rects[i].height <= 0) continue;
      var r = box(rects[i]);
      r.t = text.slice(0, 60);
      out.texts.push(r);
    }
  }
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var labels = function (sel) {
      return Array.from(svg.querySelectorAll(sel)).map(function (e) { return e.textContent; });
    };
    out.charts.push({
      title: (svg.querySelector('.chart-title') || {textContent: ''}).textContent,
      x_ticks: labels('.tick-x text'),
      y_ticks: labels('.tick-y text'),
      legend: labels('.legend'),
      series: Array.from(svg.querySelectorAll('polyline.series')).map(function (p) {
        var marker = p.nextElementSibling;
        return {name: p.getAttribute('data-series'), color: p.getAttribute('stroke'),
                points: p.points.numberOfItems, marker: marker ? marker.tagName : ''};
      })
    });
  });
  var pre = document.createElement('pre');
  pre.id = 'latchkey-layout';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
)js";

// The entities --dump-dom writes in text.
std::string Unescape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    bool replaced = false;
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"&lt;", "<"}, {"&gt;", ">"}, {"&nbsp;", "\u00a0"}, {"&amp;", "&"}}) {
      if (s.compare(i, from.size(), from) == 0) {
        out += to;
        i += from.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += s[i];
  }
  return out;
}

// The job page as the coordinator serves it, laid out by Chromium: no two text boxes overlap
// (the title, the legend, the tick labels and axis labels of every chart, and the page's text),
// every chart has at least two tick labels on each axis, numbers increasing, the eval loss is a
// series of its own colour and marker, and the collective share, peak memory and compute per
// micro-batch (the straggler score) charts have a series per rank. The screenshot stays under the
// build's test output folder.
TEST_F(LiveJobTest, StatusPageChartsHaveTicksAndNoOverlappingText) {
  LATCHKEY_REQUIRE_TOOL("chromium", "Debian package chromium");
  const std::string base = "http://127.0.0.1:" + std::to_string(live->coordinator_port);
  httplib::Client c("127.0.0.1", live->coordinator_port);
  c.set_read_timeout(10);
  auto res = c.Get(("/jobs/" + live->job_id).c_str());
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  std::string html = res->body;
  const size_t end = html.rfind("</body>");
  ASSERT_NE(end, std::string::npos) << html;
  html.insert(end, std::string("<script>") + kLayoutScript + "</script>");
  const std::string file = live->dir + "/job-page.html";
  std::ofstream(file) << html;
  const Captured dom =
      RunAndCapture({"chromium", "--headless", "--no-sandbox", "--disable-gpu",
                     "--user-data-dir=" + live->dir + "/chromium-layout", "--window-size=1280,1600",
                     "--run-all-compositor-stages-before-draw", "--virtual-time-budget=2000",
                     "--dump-dom", "file://" + file},
                    seconds(60));
  ASSERT_EQ(dom.exit_code, 0) << dom.output;
  // Found without std::regex, which recurses per character (a long match overflows the stack).
  const std::string open = "<pre id=\"latchkey-layout\">";
  const size_t from = dom.output.find(open);
  ASSERT_NE(from, std::string::npos) << dom.output;
  const size_t to = dom.output.find("</pre>", from);
  ASSERT_NE(to, std::string::npos) << dom.output;
  const std::string json = dom.output.substr(from + open.size(), to - from - open.size());
  const auto layout = nlohmann::json::parse(Unescape(json), nullptr, false);
  ASSERT_FALSE(layout.is_discarded()) << json;
  ASSERT_TRUE(layout.contains("texts") && layout.contains("charts")) << json;

  const auto& texts = layout["texts"];
  ASSERT_GE(texts.size(), 40u) << layout.dump();
  int overlaps = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    for (size_t j = i + 1; j < texts.size(); ++j) {
      const auto& a = texts[i];
      const auto& b = texts[j];
      const double dx = std::min(a["x"].get<double>() + a["w"].get<double>(),
                                 b["x"].get<double>() + b["w"].get<double>()) -
                        std::max(a["x"].get<double>(), b["x"].get<double>());
      const double dy = std::min(a["y"].get<double>() + a["h"].get<double>(),
                                 b["y"].get<double>() + b["h"].get<double>()) -
                        std::max(a["y"].get<double>(), b["y"].get<double>());
      if (dx > 0.5 && dy > 0.5) {
        ++overlaps;
        ADD_FAILURE() << "text boxes overlap: " << a.dump() << " and " << b.dump();
      }
    }
  }
  EXPECT_EQ(overlaps, 0);

  const auto& charts = layout["charts"];
  ASSERT_EQ(charts.size(), 5u) << charts.dump();
  std::map<std::string, nlohmann::json> by_title;
  for (const auto& chart : charts) {
    const std::string title = chart.value("title", "");
    for (const char* axis : {"x_ticks", "y_ticks"}) {
      const auto& ticks = chart[axis];
      ASSERT_GE(ticks.size(), 2u) << title << " " << axis << ": " << chart.dump();
      double previous = -INFINITY;
      for (const auto& t : ticks) {
        const double v = std::stod(t.get<std::string>());
        EXPECT_GT(v, previous) << title << " " << axis << ": " << ticks.dump();
        previous = v;
      }
    }
    by_title[title.substr(0, title.find(" (newest"))] = chart;
  }
  const auto series = [&](const std::string& chart, const std::string& name) {
    for (const auto& s : by_title[chart]["series"]) {
      if (s.value("name", "") == name) return s;
    }
    return nlohmann::json();
  };
  const auto loss = series("loss per step", "loss");
  const auto eval = series("loss per step", "eval loss");
  ASSERT_FALSE(loss.is_null() || eval.is_null()) << by_title["loss per step"].dump();
  EXPECT_GE(loss.value("points", 0), 8);
  EXPECT_GE(eval.value("points", 0), 2);  // evaluated every 4 steps
  EXPECT_NE(loss.value("color", ""), eval.value("color", ""));
  EXPECT_NE(loss.value("marker", ""), eval.value("marker", ""));
  EXPECT_EQ(by_title["loss per step"]["legend"], nlohmann::json::array({"loss", "eval loss"}));
  EXPECT_GE(series("K/V all-reduces per step, rank 0", "K/V all-reduces").value("points", 0), 8);
  for (const std::string chart : {"collective share of step time per rank", "peak memory per rank",
                                  "compute per micro-batch per rank"}) {
    for (const std::string rank : {"rank 0", "rank 1"}) {
      EXPECT_GE(series(chart, rank).value("points", 0), 8) << chart << ": " << rank;
    }
    // Measured values: the lowest tick at or above 0, the highest above it (a chart of zeros
    // would centre its range on 0).
    const auto& y = by_title[chart]["y_ticks"];
    ASSERT_GE(y.size(), 2u) << chart;
    EXPECT_GE(std::stod(y.front().get<std::string>()), 0.0) << chart << ": " << y.dump();
  }

  // The screenshot of the page as served, kept for people to look at.
  fs::create_directories(LATCHKEY_TEST_OUTPUT_DIR);
  const std::string png = std::string(LATCHKEY_TEST_OUTPUT_DIR) + "/status-page-charts.png";
  fs::remove(png);
  const Captured shot =
      RunAndCapture({"chromium", "--headless", "--no-sandbox", "--disable-gpu",
                     "--user-data-dir=" + live->dir + "/chromium-shot", "--window-size=1280,1600",
                     "--screenshot=" + png, base + "/jobs/" + live->job_id},
                    seconds(60));
  ASSERT_EQ(shot.exit_code, 0) << shot.output;
  const std::string bytes = ReadText(png);
  ASSERT_GT(bytes.size(), 20000u) << shot.output;
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  std::printf("status page screenshot: %s (%zu bytes)\n", png.c_str(), bytes.size());
}

}  // namespace
}  // namespace latchkey::testing
