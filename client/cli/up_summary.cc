// The summary `latchkey up` ends with: rank 0's per-step JSONL in one table.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "client/cli/up.h"

namespace latchkey::cli {
namespace {

// The largest peak_memory_bytes of a rank's JSONL, or -1 when it has none (no file, or records
// from a worker that did not measure memory).
int64_t MaxPeakMemory(const std::string& path) {
  std::ifstream in(path);
  if (!in) return -1;
  int64_t peak = -1;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("peak_memory_bytes") &&
        row["peak_memory_bytes"].is_number_integer()) {
      peak = std::max(peak, row["peak_memory_bytes"].get<int64_t>());
    }
  }
  return peak;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void PrintUpSummary(const std::string& jsonl, const JobInfo* job, int worker_restarts,
                    int coordinator_restarts) {
  // A restarted rank appends to its JSONL: the last record of a step is the one that counts.
  std::map<int64_t, nlohmann::json> by_step;
  std::ifstream in(jsonl);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("step")) by_step[row["step"].get<int64_t>()] = row;
  }
  std::vector<nlohmann::json> rows;
  for (auto& [step, row] : by_step) rows.push_back(std::move(row));
  if (rows.empty()) return;
  std::vector<double> secs;
  std::map<std::string, std::pair<int64_t, int64_t>> kv;  // mode -> (calls, steps)
  std::map<std::string, int64_t> calls;
  int64_t tokens = 0;
  for (const auto& r : rows) {
    secs.push_back(r["step_seconds"].get<double>());
    auto& k = kv[r["kv_mode"].get<std::string>()];
    k.first += r["kv_allreduce_calls"].get<int64_t>();
    k.second += 1;
    for (auto it = r["collective_calls"].begin(); it != r["collective_calls"].end(); ++it) {
      calls[it.key()] += it.value().get<int64_t>();
    }
    tokens += r["tokens"].get<int64_t>();
  }
  const double median = Median(secs);
  std::printf("\nsummary (rank 0)\n");
  std::printf("  %-36s %zu\n", "steps", rows.size());
  std::printf("  %-36s %.4f -> %.4f\n", "loss first -> final", rows.front()["loss"].get<double>(),
              rows.back()["loss"].get<double>());
  // Evaluation (latchkey.eval) and the learning rate schedule, from the steps that carry them.
  std::vector<std::pair<int64_t, double>> evals;  // step, eval_loss
  std::vector<double> lrs;
  for (const auto& r : rows) {
    if (r.contains("eval_loss") && r["eval_loss"].is_number()) {
      evals.emplace_back(r["step"].get<int64_t>(), r["eval_loss"].get<double>());
    }
    if (r.contains("lr") && r["lr"].is_number()) lrs.push_back(r["lr"].get<double>());
  }
  if (!evals.empty()) {
    std::printf("  %-36s %.4f -> %.4f  (%zu evaluations, steps %lld .. %lld)\n",
                "eval loss first -> final", evals.front().second, evals.back().second, evals.size(),
                static_cast<long long>(evals.front().first),
                static_cast<long long>(evals.back().first));
  }
  if (!lrs.empty()) {
    const auto [lo, hi] = std::minmax_element(lrs.begin(), lrs.end());
    std::printf("  %-36s %.3e .. %.3e  (first %.3e, final %.3e)\n", "lr min .. max", *lo, *hi,
                lrs.front(), lrs.back());
  }
  for (const auto& [mode, k] : kv) {
    std::printf("  %-36s %.1f  (%lld steps)\n", ("K/V all-reduces/step, " + mode).c_str(),
                static_cast<double>(k.first) / k.second, static_cast<long long>(k.second));
  }
  for (const auto& [key, n] : calls) {
    std::printf("  %-36s %.1f\n", ("collectives/step " + key).c_str(),
                static_cast<double>(n) / rows.size());
  }
  if (job != nullptr) {
    // The job's recoveries (each a new attempt), then the processes `up` started again.
    std::printf("  %-36s %d (attempt %lld)\n", "restarts", job->restarts,
                static_cast<long long>(std::max<int64_t>(1, job->attempt)));
  }
  if (worker_restarts > 0 || coordinator_restarts > 0) {
    std::printf("  %-36s %d worker, %d coordinator\n", "processes started again", worker_restarts,
                coordinator_restarts);
  }
  // Memory per rank: every rank's JSONL sits beside rank 0's as steps-R.jsonl.
  const std::string suffix = "steps-0.jsonl";
  if (jsonl.size() >= suffix.size() &&
      jsonl.compare(jsonl.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string dir = jsonl.substr(0, jsonl.size() - suffix.size());
    for (int rank = 0;; ++rank) {
      const int64_t peak = MaxPeakMemory(dir + "steps-" + std::to_string(rank) + ".jsonl");
      if (peak < 0) break;
      std::printf("  %-36s %.1f MiB\n", ("peak memory, rank " + std::to_string(rank)).c_str(),
                  static_cast<double>(peak) / (1 << 20));
    }
  }
  if (rows.back().contains("activation_memory_bytes")) {
    std::printf("  %-36s %.1f MiB\n", "activation memory (last step)",
                rows.back()["activation_memory_bytes"].get<double>() / (1 << 20));
  }
  std::printf("  %-36s %.3f s\n", "median step time", median);
  std::printf("  %-36s %.0f\n", "tokens/s (median step)",
              rows.back()["tokens"].get<double>() / std::max(median, 1e-9));
}

}  // namespace latchkey::cli
