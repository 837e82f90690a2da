// The metrics endpoint inside the real latchkey-worker binary (which links libtorch + OpenBLAS:
// the civetweb TLS pitfall), checked with promtool and scraped by a real Prometheus server.
#include "worker/metrics/worker_metrics.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "tests/support/free_port.h"
#include "tests/support/launch.h"
#include "tests/support/metrics_scrape.h"
#include "tests/support/process.h"
#include "tests/support/specs.h"

namespace latchkey::testing {
namespace {

nlohmann::json MetricsSpec() {
  RunShape s;
  s.tp = 2;
  s.gas = 2;
  s.steps = 4;
  s.kv_reduce = "coalesced";
  s.scheduler = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}}}};
  s.eval = {{"tokens_file", FixtureDir() + "/eval.bin"}, {"every_steps", 2}, {"samples", 3}};
  return FixtureSpec(s);
}

TEST(WorkerMetrics, TrainingSeriesExistFromTheStart) {
  const std::string text = WorkerMetrics().Serialize();
  for (const char* series :
       {"latchkey_learning_rate", "latchkey_eval_loss", "latchkey_eval_collective_calls_total"}) {
    EXPECT_EQ(MetricSample(text, series), 0) << series << "\n" << text;
  }
}

// A diverged step (common/step_report.h StepDiverged) applied no update: the optimizer step
// counter stays, the loss and grad norm gauges say NaN and +Inf (which the text format and promtool
// accept).
TEST(WorkerMetrics, ADivergedStepCountsNoOptimizerStepAndShowsItsValues) {
  WorkerMetrics m;
  StepReport ok;
  ok.step = 0;
  ok.loss = 5.5;
  ok.grad_norm = 1.25;
  m.ObserveStep(ok, 128, 1, 1);
  StepReport diverged = ok;
  diverged.step = 1;
  diverged.loss = std::nan("");
  diverged.grad_norm = INFINITY;
  m.ObserveStep(diverged, 128, 1, 1);
  const std::string text = m.Serialize();
  EXPECT_EQ(MetricSample(text, "latchkey_optimizer_steps_total"), 1) << text;
  EXPECT_TRUE(std::isnan(MetricSample(text, "latchkey_loss"))) << text;
  EXPECT_TRUE(std::regex_search(text, std::regex("\nlatchkey_loss nan\n", std::regex::icase)))
      << text;
  EXPECT_EQ(MetricSample(text, "latchkey_grad_norm"), INFINITY) << text;
  EXPECT_EQ(MetricSample(text, "latchkey_tokens_total"), 256) << text;  // both windows ran
  const Captured lint = PromtoolCheck(::testing::TempDir(), text);
  EXPECT_EQ(lint.exit_code, 0) << lint.output << text;
}

TEST(WorkerMetrics, EndpointCountsMatchJsonlAndPassPromtool) {
  WorkerGroup g = StartWorkers(
      MetricsSpec(), 2,
      {"--metrics-port", "0", "--metrics-host", "127.0.0.1", "--linger-seconds", "60"});
  const int port = WaitForRankMetricsPort(g, 0);
  ASSERT_GT(port, 0) << RankStderr(g, 0);
  // Wait for the 4 steps to be reported.
  const std::string text = ScrapeRankMetrics(port, "latchkey_optimizer_steps_total", 4);
  ASSERT_EQ(MetricSample(text, "latchkey_optimizer_steps_total"), 4) << text;
  const Captured lint = PromtoolCheck(g.run.dir, text);
  EXPECT_EQ(lint.exit_code, 0) << lint.output << text;

  for (int pid : g.pids) kill(pid, SIGTERM);
  WorkerRun run = WaitWorkers(std::move(g), std::chrono::seconds(30));
  ASSERT_EQ(run.steps[0].size(), 4u);
  double kv = 0, tp_calls = 0;
  for (const auto& step : run.steps[0]) {
    kv += step["kv_allreduce_calls"].get<double>();
    tp_calls += step["collective_calls"]["all_reduce/tp"].get<double>();
  }
  EXPECT_EQ(kv, 4.0);  // coalesced: 1 per step
  EXPECT_EQ(MetricSample(text, "latchkey_kv_allreduce_total{mode=\"coalesced\"}"), kv);
  EXPECT_EQ(MetricSample(text, "latchkey_kv_allreduce_total{mode=\"per_micro_batch\"}"), 0);
  // Evaluation (steps 1 and 3, 3 samples, 2 TP all-reduces per layer forward) is counted in the
  // collective series under its own tag, never in a step's collective_calls.
  const double eval_calls = MetricSample(text, "latchkey_eval_collective_calls_total");
  EXPECT_EQ(eval_calls, 2 * 3 * 2 * 2);
  EXPECT_EQ(MetricSample(text, "latchkey_collective_calls_total{group=\"tp\",op=\"all_reduce\"}"),
            tp_calls + eval_calls);
  EXPECT_EQ(MetricSample(text, "latchkey_learning_rate"), run.steps[0][3]["lr"].get<double>());
  EXPECT_EQ(MetricSample(text, "latchkey_eval_loss"), run.steps[0][3]["eval_loss"].get<double>());
  EXPECT_EQ(MetricSample(text, "latchkey_tokens_total"), 4 * 2 * 2 * 32);  // steps * GAS * MB * S
  EXPECT_NEAR(MetricSample(text, "latchkey_loss"), run.steps[0][3]["loss"].get<double>(), 1e-6);
  EXPECT_EQ(MetricSample(text, "latchkey_step_seconds_count"), 4);
}

TEST(WorkerMetrics, RealPrometheusScrapesTheWorker) {
  WorkerGroup g = StartWorkers(
      MetricsSpec(), 2,
      {"--metrics-port", "0", "--metrics-host", "127.0.0.1", "--linger-seconds", "120"});
  const int port = WaitForRankMetricsPort(g, 0);
  ASSERT_GT(port, 0) << RankStderr(g, 0);
  const std::string text = ScrapeRankMetrics(port, "latchkey_optimizer_steps_total", 4);
  const double endpoint_value =
      MetricSample(text, "latchkey_kv_allreduce_total{mode=\"coalesced\"}");
  ASSERT_EQ(endpoint_value, 4.0) << text;

  const std::string dir = g.run.dir + "/prometheus";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: latchkey-worker\n"
      << "    static_configs:\n      - targets: ['127.0.0.1:" << port << "']\n";
  const int prom_port = FreePort();
  std::vector<std::string> args = {"prometheus", "--config.file=" + dir + "/prometheus.yml",
                                   "--storage.tsdb.path=" + dir + "/data",
                                   "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)};
  const int prom = StartProcess(args, {}, dir + "/prometheus.log");
  ASSERT_GT(prom, 0) << "cannot start prometheus";

  double scraped = NAN;
  httplib::Client c("127.0.0.1", prom_port);
  c.set_read_timeout(5);
  for (int i = 0; i < 120 && std::isnan(scraped); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto res = c.Get("/api/v1/query?query=latchkey_kv_allreduce_total%7Bmode%3D%22coalesced%22%7D");
    if (!res || res->status != 200) continue;
    const auto body = nlohmann::json::parse(res->body, nullptr, false);
    if (body.is_discarded() || body["data"]["result"].empty()) continue;
    scraped = std::stod(body["data"]["result"][0]["value"][1].get<std::string>());
  }
  kill(prom, SIGTERM);
  WaitProcess(prom, std::chrono::seconds(30));
  for (int pid : g.pids) kill(pid, SIGTERM);
  WaitWorkers(std::move(g), std::chrono::seconds(30));
  EXPECT_EQ(scraped, endpoint_value);
}

}  // namespace
}  // namespace latchkey::testing
