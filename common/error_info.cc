#include "common/error_info.h"

#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace latchkey {

std::optional<int64_t> ErrorInfo::IntMetadata(const std::string& key) const {
  auto it = metadata.find(key);
  int64_t v = 0;
  if (it == metadata.end() || !absl::SimpleAtoi(it->second, &v)) return std::nullopt;
  return v;
}

std::string EncodeErrorInfo(const ErrorInfo& info) {
  nlohmann::json j = {
      {"reason", info.reason}, {"domain", info.domain}, {"metadata", info.metadata}};
  return j.dump();
}

std::optional<ErrorInfo> DecodeErrorInfo(absl::string_view bytes) {
  nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr,
                                           /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("reason") || !j["reason"].is_string()) return std::nullopt;
  ErrorInfo info;
  info.reason = j["reason"].get<std::string>();
  if (j.contains("domain") && j["domain"].is_string()) info.domain = j["domain"].get<std::string>();
  if (j.contains("metadata")) {
    if (!j["metadata"].is_object()) return std::nullopt;
    for (const auto& [k, v] : j["metadata"].items()) {
      if (!v.is_string()) return std::nullopt;
      info.metadata[k] = v.get<std::string>();
    }
  }
  return info;
}

absl::Status WithErrorInfo(absl::Status status, const ErrorInfo& info) {
  if (status.ok()) return status;
  status.SetPayload(kErrorInfoTypeUrl, absl::Cord(EncodeErrorInfo(info)));
  return status;
}

std::optional<ErrorInfo> GetErrorInfo(const absl::Status& status) {
  // absl::optional: this abseil may not alias std::optional.
  const auto payload = status.GetPayload(kErrorInfoTypeUrl);
  if (!payload) return std::nullopt;
  return DecodeErrorInfo(std::string(*payload));
}

bool HasErrorReason(const absl::Status& status, absl::string_view reason) {
  std::optional<ErrorInfo> info = GetErrorInfo(status);
  return info && info->domain == kErrorDomain && info->reason == reason;
}

absl::Status SessionClosedError() {
  ErrorInfo info;
  info.reason = error_reason::kSessionClosed;
  return WithErrorInfo(absl::FailedPreconditionError("session closed"), info);
}

absl::Status AttemptFencedError(absl::string_view message, int64_t job_attempt,
                                int64_t worker_attempt) {
  ErrorInfo info;
  info.reason = error_reason::kAttemptFenced;
  info.metadata = {{"job_attempt", std::to_string(job_attempt)},
                   {"worker_attempt", std::to_string(worker_attempt)}};
  return WithErrorInfo(absl::AbortedError(message), info);
}

absl::Status AttemptStoppedError(int64_t before_window) {
  ErrorInfo info;
  info.reason = error_reason::kAttemptStopped;
  info.metadata = {{"before_window", std::to_string(before_window)}};
  return WithErrorInfo(
      absl::AbortedError(absl::StrCat("the attempt stops before window ", before_window,
                                      ": saving the state after step ", before_window - 1)),
      info);
}

std::string NonFiniteName(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Inf" : "-Inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", value);
  return buf;
}

absl::Status TrainingDivergedError(absl::string_view quantity, double value, int64_t step,
                                   int rank) {
  ErrorInfo info;
  info.reason = error_reason::kTrainingDiverged;
  info.metadata = {{"quantity", std::string(quantity)},
                   {"value", NonFiniteName(value)},
                   {"step", std::to_string(step)},
                   {"rank", std::to_string(rank)}};
  return WithErrorInfo(
      absl::FailedPreconditionError(absl::StrCat(quantity, " is ", NonFiniteName(value),
                                                 " at step ", step, " (rank ", rank, ")")),
      info);
}

}  // namespace latchkey
