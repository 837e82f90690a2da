// The one place absl::Status and grpc::Status meet: conversions live in exactly this file.
//
// Codes map one to one (both follow google.rpc.Code); messages pass through unchanged.
#ifndef LATCHKEY_PROTO_GRPC_STATUS_H_
#define LATCHKEY_PROTO_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace latchkey {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace latchkey

#endif  // LATCHKEY_PROTO_GRPC_STATUS_H_
