// The summary `latchkey up` ends with: rank 0's per-step JSONL in one table.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/cli/up.h"

namespace latchkey::cli {
namespace {

// A number of a JSONL record; nullopt when the field is absent, null (the JSONL writes a loss or
// gradient norm that was not finite as null: JSON has no NaN) or not a number.
std::optional<double> Number(const nlohmann::json& row, const char* key) {
  const auto it = row.find(key);
  if (it == row.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// An integer of a JSONL record; 0 when absent or not an integer.
int64_t Integer(const nlohmann::json& row, const char* key) {
  const auto it = row.find(key);
  return it != row.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

std::string LossText(std::optional<double> loss) {
  return loss ? absl::StrFormat("%.4f", *loss) : std::string("not finite");
}

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

std::string UpSummary(const std::string& jsonl, const JobInfo* job, int worker_restarts,
                      int coordinator_restarts) {
  // A restarted rank appends to its JSONL: the last record of a step is the one that counts.
  std::map<int64_t, nlohmann::json> by_step;
  std::ifstream in(jsonl);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("step") && row["step"].is_number_integer()) {
      by_step[row["step"].get<int64_t>()] = row;
    }
  }
  std::vector<nlohmann::json> rows;
  for (auto& [step, row] : by_step) rows.push_back(std::move(row));
  if (rows.empty()) return "";
  std::string out;
  std::vector<double> secs;
  std::map<std::string, std::pair<int64_t, int64_t>> kv;  // mode -> (calls, steps)
  std::map<std::string, int64_t> calls;
  std::optional<int64_t> diverged;  // the first step whose loss or grad norm was not finite
  for (const auto& r : rows) {
    secs.push_back(Number(r, "step_seconds").value_or(0));
    if (r.contains("kv_mode") && r["kv_mode"].is_string()) {
      auto& k = kv[r["kv_mode"].get<std::string>()];
      k.first += Integer(r, "kv_allreduce_calls");
      k.second += 1;
    }
    if (r.contains("collective_calls") && r["collective_calls"].is_object()) {
      for (auto it = r["collective_calls"].begin(); it != r["collective_calls"].end(); ++it) {
        if (it.value().is_number_integer()) calls[it.key()] += it.value().get<int64_t>();
      }
    }
    if (!diverged && (!Number(r, "loss") || !Number(r, "grad_norm"))) {
      diverged = Integer(r, "step");
    }
  }
  const double median = Median(secs);
  absl::StrAppendFormat(&out, "\nsummary (rank 0)\n");
  absl::StrAppendFormat(&out, "  %-36s %zu\n", "steps", rows.size());
  absl::StrAppendFormat(&out, "  %-36s %s -> %s\n", "loss first -> final",
                        LossText(Number(rows.front(), "loss")),
                        LossText(Number(rows.back(), "loss")));
  if (diverged) {
    absl::StrAppendFormat(&out, "  %-36s step %d (loss or grad_norm not finite; not applied)\n",
                          "diverged at", *diverged);
  }
  // Evaluation (latchkey.eval) and the learning rate schedule, from the steps that carry them.
  std::vector<std::pair<int64_t, double>> evals;  // step, eval_loss
  std::vector<double> lrs;
  for (const auto& r : rows) {
    if (std::optional<double> e = Number(r, "eval_loss")) {
      evals.emplace_back(Integer(r, "step"), *e);
    }
    if (std::optional<double> lr = Number(r, "lr")) lrs.push_back(*lr);
  }
  if (!evals.empty()) {
    absl::StrAppendFormat(&out, "  %-36s %.4f -> %.4f  (%zu evaluations, steps %d .. %d)\n",
                          "eval loss first -> final", evals.front().second, evals.back().second,
                          evals.size(), evals.front().first, evals.back().first);
  }
  if (!lrs.empty()) {
    const auto [lo, hi] = std::minmax_element(lrs.begin(), lrs.end());
    absl::StrAppendFormat(&out, "  %-36s %.3e .. %.3e  (first %.3e, final %.3e)\n", "lr min .. max",
                          *lo, *hi, lrs.front(), lrs.back());
  }
  for (const auto& [mode, k] : kv) {
    absl::StrAppendFormat(&out, "  %-36s %.1f  (%d steps)\n", "K/V all-reduces/step, " + mode,
                          static_cast<double>(k.first) / k.second, k.second);
  }
  for (const auto& [key, n] : calls) {
    absl::StrAppendFormat(&out, "  %-36s %.1f\n", "collectives/step " + key,
                          static_cast<double>(n) / rows.size());
  }
  if (job != nullptr) {
    // The job's recoveries (each a new attempt), then the processes `up` started again.
    absl::StrAppendFormat(&out, "  %-36s %d (attempt %d)\n", "restarts", job->restarts,
                          std::max<int64_t>(1, job->attempt));
  }
  if (worker_restarts > 0 || coordinator_restarts > 0) {
    absl::StrAppendFormat(&out, "  %-36s %d worker, %d coordinator\n", "processes started again",
                          worker_restarts, coordinator_restarts);
  }
  // Memory per rank: every rank's JSONL sits beside rank 0's as steps-R.jsonl.
  const std::string suffix = "steps-0.jsonl";
  if (jsonl.size() >= suffix.size() &&
      jsonl.compare(jsonl.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string dir = jsonl.substr(0, jsonl.size() - suffix.size());
    for (int rank = 0;; ++rank) {
      const int64_t peak = MaxPeakMemory(dir + "steps-" + std::to_string(rank) + ".jsonl");
      if (peak < 0) break;
      absl::StrAppendFormat(&out, "  %-36s %.1f MiB\n", "peak memory, rank " + std::to_string(rank),
                            static_cast<double>(peak) / (1 << 20));
    }
  }
  if (std::optional<double> act = Number(rows.back(), "activation_memory_bytes")) {
    absl::StrAppendFormat(&out, "  %-36s %.1f MiB\n", "activation memory (last step)",
                          *act / (1 << 20));
  }
  absl::StrAppendFormat(&out, "  %-36s %.3f s\n", "median step time", median);
  absl::StrAppendFormat(
      &out, "  %-36s %.0f\n", "tokens/s (median step)",
      static_cast<double>(Integer(rows.back(), "tokens")) / std::max(median, 1e-9));
  return out;
}

void PrintUpSummary(const std::string& jsonl, const JobInfo* job, int worker_restarts,
                    int coordinator_restarts) {
  std::fputs(UpSummary(jsonl, job, worker_restarts, coordinator_restarts).c_str(), stdout);
}

}  // namespace latchkey::cli
