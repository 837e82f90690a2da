// The one place absl::Status and grpc::Status meet: conversions live in exactly this file.
//
// Codes map one to one (both follow google.rpc.Code); messages pass through unchanged. An
// ErrorInfo attached to an absl::Status (common/error_info.h) travels as the call's binary
// error details: a google.rpc.Status (latchkey.v1.RpcStatus, wire-identical) whose details hold
// one google.protobuf.Any of type URL kErrorInfoTypeUrl (latchkey.v1.ErrorInfo, wire-identical
// to google.rpc.ErrorInfo); gRPC sends it in the trailer grpc-status-details-bin. FromGrpcStatus
// reads it back, so the receiver decides with HasErrorReason / GetErrorInfo. Details that do not
// parse, and details of other types, are ignored (the code and message still arrive).
//
// Thread-safety: pure functions.
#ifndef LATCHKEY_PROTO_GRPC_STATUS_H_
#define LATCHKEY_PROTO_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace latchkey {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace latchkey

#endif  // LATCHKEY_PROTO_GRPC_STATUS_H_
