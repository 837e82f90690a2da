// A worker rank's Prometheus endpoint from a test: the port the rank printed on stderr
// ("rank R metrics: http://HOST:PORT/metrics"), a scrape of it over plain HTTP on 127.0.0.1, the
// value of one sample in the exposition, and promtool's verdict on it. Every wait has a deadline.
//
//   const int port = WaitForRankMetricsPort(group, 0);
//   const std::string text = ScrapeRankMetrics(port, "latchkey_optimizer_steps_total", 4);
//   EXPECT_EQ(MetricSample(text, "latchkey_tokens_total"), 256);
#ifndef LATCHKEY_TESTS_SUPPORT_METRICS_SCRAPE_H_
#define LATCHKEY_TESTS_SUPPORT_METRICS_SCRAPE_H_

#include <chrono>
#include <string>

#include "tests/support/launch.h"
#include "tests/support/process.h"

namespace latchkey::testing {

// Rank `rank`'s metrics port in a worker's stderr; 0 when it has not printed it.
int RankMetricsPort(const std::string& stderr_text, int rank);
// Polls RankStderr(group, rank) until the rank printed its port; 0 at the deadline.
int WaitForRankMetricsPort(const WorkerGroup& group, int rank,
                           std::chrono::milliseconds deadline = std::chrono::seconds(30));
// GET http://127.0.0.1:PORT/metrics: the body, "" without a 200.
std::string ScrapeMetrics(int port);
// Scrapes until sample `series` reads `value` (a rank that has reported that far); the last
// exposition read, whatever it says, at the deadline.
std::string ScrapeRankMetrics(int port, const std::string& series, double value,
                              std::chrono::milliseconds deadline = std::chrono::seconds(60));
// The value of the sample line "SERIES VALUE" (SERIES with its labels, if any); NaN when absent.
double MetricSample(const std::string& text, const std::string& series);
// `promtool check metrics` on `text` (written to DIR/metrics.txt first).
Captured PromtoolCheck(const std::string& dir, const std::string& text);

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_METRICS_SCRAPE_H_
