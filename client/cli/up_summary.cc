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

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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
  // The job's steps are those every rank reported (its steps_completed, what the progress line
  // and `status` show): a step rank 0 finished after the job ended (cancelled, failed) is in
  // its JSONL but not the job's, and is left out here too.
  std::vector<nlohmann::json> rows;
  int64_t past_end = 0;
  for (auto& [step, row] : by_step) {
    if (job != nullptr && step >= job->steps_completed) {
      ++past_end;
    } else {
      rows.push_back(std::move(row));
    }
  }
  if (rows.empty() && past_end == 0) return "";
  // Every line's value starts in one column, past the longest label.
  std::vector<std::pair<std::string, std::string>> lines;
  auto line = [&lines](std::string label, std::string value) {
    lines.emplace_back(std::move(label), std::move(value));
  };
  line("steps", std::to_string(rows.size()) +
                    (past_end > 0 ? absl::StrFormat("  (rank 0 logged %lld more after the job "
                                                    "ended: not counted)",
                                                    static_cast<long long>(past_end))
                                  : std::string()));
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
  if (!rows.empty()) {
    line("loss first -> final", absl::StrCat(LossText(Number(rows.front(), "loss")), " -> ",
                                             LossText(Number(rows.back(), "loss"))));
  }
  if (diverged) {
    line("diverged at", absl::StrFormat("step %lld (loss or grad_norm not finite; not applied)",
                                        static_cast<long long>(*diverged)));
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
    line("eval loss first -> final",
         absl::StrFormat("%.4f -> %.4f  (%d evaluations, steps %lld .. %lld)", evals.front().second,
                         evals.back().second, evals.size(),
                         static_cast<long long>(evals.front().first),
                         static_cast<long long>(evals.back().first)));
  }
  if (!lrs.empty()) {
    const auto [lo, hi] = std::minmax_element(lrs.begin(), lrs.end());
    line("lr min .. max", absl::StrFormat("%.3e .. %.3e  (first %.3e, final %.3e)", *lo, *hi,
                                          lrs.front(), lrs.back()));
  }
  for (const auto& [mode, k] : kv) {
    line("K/V all-reduces/step, " + mode,
         absl::StrFormat("%.1f  (%lld steps)", static_cast<double>(k.first) / k.second,
                         static_cast<long long>(k.second)));
  }
  for (const auto& [key, n] : calls) {
    line("collectives/step " + key,
         absl::StrFormat("%.1f", static_cast<double>(n) / static_cast<double>(rows.size())));
  }
  if (job != nullptr) {
    // The job's recoveries (each a new attempt), then the processes `up` started again.
    line("restarts", absl::StrFormat("%d (attempt %lld)", job->restarts,
                                     static_cast<long long>(std::max<int64_t>(1, job->attempt))));
  }
  if (worker_restarts > 0 || coordinator_restarts > 0) {
    line("processes started again",
         absl::StrFormat("%d worker, %d coordinator", worker_restarts, coordinator_restarts));
  }
  // Memory per rank: every rank's JSONL sits beside rank 0's as steps-R.jsonl.
  const std::string suffix = "steps-0.jsonl";
  if (absl::EndsWith(jsonl, suffix)) {
    const std::string dir = jsonl.substr(0, jsonl.size() - suffix.size());
    for (int rank = 0;; ++rank) {
      const int64_t peak = MaxPeakMemory(dir + "steps-" + std::to_string(rank) + ".jsonl");
      if (peak < 0) break;
      line("peak memory, rank " + std::to_string(rank),
           absl::StrFormat("%.1f MiB", static_cast<double>(peak) / (1 << 20)));
    }
  }
  if (!rows.empty()) {
    if (std::optional<double> act = Number(rows.back(), "activation_memory_bytes")) {
      line("activation memory (last step)", absl::StrFormat("%.1f MiB", *act / (1 << 20)));
    }
    line("median step time", absl::StrFormat("%.3f s", median));
    line("tokens/s (median step)",
         absl::StrFormat(
             "%.0f", static_cast<double>(Integer(rows.back(), "tokens")) / std::max(median, 1e-9)));
  }
  size_t width = 36;
  for (const auto& [label, value] : lines) width = std::max(width, label.size());
  std::string out = "\nsummary (rank 0)\n";
  for (const auto& [label, value] : lines) {
    absl::StrAppendFormat(&out, "  %-*s %s\n", static_cast<int>(width), label, value);
  }
  return out;
}

void PrintUpSummary(const std::string& jsonl, const JobInfo* job, int worker_restarts,
                    int coordinator_restarts) {
  std::fputs(UpSummary(jsonl, job, worker_restarts, coordinator_restarts).c_str(), stdout);
}

}  // namespace latchkey::cli
