#include "tests/support/metrics_scrape.h"

#include <httplib.h>

#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

namespace latchkey::testing {

// The first "rank R metrics: http://HOST:PORT/metrics" (HOST without ':'). Scanned by hand:
// <regex> does not build under the sanitizers' -Werror with GCC 12 (maybe-uninitialized).
int RankMetricsPort(const std::string& stderr_text, int rank) {
  const std::string prefix = "rank " + std::to_string(rank) + " metrics: http://";
  for (size_t at = stderr_text.find(prefix); at != std::string::npos;
       at = stderr_text.find(prefix, at + 1)) {
    const size_t host = at + prefix.size();
    const size_t colon = stderr_text.find_first_of(":/\n", host);
    if (colon == std::string::npos || colon == host || stderr_text[colon] != ':') continue;
    size_t end = colon + 1;
    while (end < stderr_text.size() && std::isdigit(static_cast<unsigned char>(stderr_text[end]))) {
      ++end;
    }
    if (end == colon + 1 || stderr_text.compare(end, 8, "/metrics") != 0) continue;
    return std::stoi(stderr_text.substr(colon + 1, end - colon - 1));
  }
  return 0;
}

int WaitForRankMetricsPort(const WorkerGroup& group, int rank, std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (true) {
    const int port = RankMetricsPort(RankStderr(group, rank), rank);
    if (port > 0 || std::chrono::steady_clock::now() >= until) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string ScrapeMetrics(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  auto res = client.Get("/metrics");
  return res && res->status == 200 ? res->body : "";
}

std::string ScrapeRankMetrics(int port, const std::string& series, double value,
                              std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (true) {
    const std::string text = ScrapeMetrics(port);
    if (MetricSample(text, series) == value || std::chrono::steady_clock::now() >= until) {
      return text;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

double MetricSample(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return NAN;
}

Captured PromtoolCheck(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/metrics.txt";
  std::ofstream(path) << text;
  return RunAndCapture({"/bin/sh", "-c", "promtool check metrics < " + path});
}

}  // namespace latchkey::testing
