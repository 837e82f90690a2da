#include "proto/grpc_status.h"

#include <optional>
#include <string>

#include "common/error_info.h"
#include "latchkey/v1/error_details.pb.h"

namespace latchkey {
namespace {

std::string EncodeDetails(const absl::Status& status, const ErrorInfo& info) {
  v1::ErrorInfo wire;
  wire.set_reason(info.reason);
  wire.set_domain(info.domain);
  for (const auto& [k, v] : info.metadata) (*wire.mutable_metadata())[k] = v;
  v1::RpcStatus rpc;
  rpc.set_code(static_cast<int32_t>(status.code()));
  rpc.set_message(std::string(status.message()));
  // Packed by hand: Any::PackFrom would name latchkey.v1.ErrorInfo, and clients unpack by the
  // google.rpc name.
  google::protobuf::Any* any = rpc.add_details();
  any->set_type_url(kErrorInfoTypeUrl);
  any->set_value(wire.SerializeAsString());
  return rpc.SerializeAsString();
}

// The first ErrorInfo among the details, if any parses.
std::optional<ErrorInfo> DecodeDetails(const std::string& bytes) {
  v1::RpcStatus rpc;
  if (!rpc.ParseFromString(bytes)) return std::nullopt;
  for (const google::protobuf::Any& any : rpc.details()) {
    if (any.type_url() != kErrorInfoTypeUrl) continue;
    v1::ErrorInfo wire;
    if (!wire.ParseFromString(any.value())) continue;
    ErrorInfo info;
    info.reason = wire.reason();
    info.domain = wire.domain();
    for (const auto& [k, v] : wire.metadata()) info.metadata[k] = v;
    return info;
  }
  return std::nullopt;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the google.rpc.Code numbering (0..16).
  const auto code = static_cast<grpc::StatusCode>(status.code());
  std::string message(status.message());
  if (std::optional<ErrorInfo> info = GetErrorInfo(status)) {
    return grpc::Status(code, std::move(message), EncodeDetails(status, *info));
  }
  return grpc::Status(code, std::move(message));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  if (!status.error_details().empty()) {
    if (std::optional<ErrorInfo> info = DecodeDetails(status.error_details())) {
      out = WithErrorInfo(std::move(out), *info);
    }
  }
  return out;
}

}  // namespace latchkey
