// absl::Status <-> grpc::Status: codes and messages pass unchanged, and an ErrorInfo rides as a
// google.rpc.Status in the binary details (what grpc-status-details-bin carries), both ways.
#include "proto/grpc_status.h"

#include <string>

#include "common/error_info.h"
#include "gtest/gtest.h"
#include "latchkey/v1/error_details.pb.h"

namespace latchkey {
namespace {

TEST(GrpcStatusTest, CodesAndMessagesPassUnchanged) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  for (int c = 1; c <= 16; ++c) {
    const absl::Status s(static_cast<absl::StatusCode>(c), "why " + std::to_string(c));
    const grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(g.error_message(), s.message());
    EXPECT_TRUE(g.error_details().empty()) << "no ErrorInfo, no details";
    EXPECT_EQ(FromGrpcStatus(g), s);
  }
}

TEST(GrpcStatusTest, FencedErrorRoundTripsWithItsDetails) {
  const absl::Status fenced =
      AttemptFencedError("worker a is at attempt 1; job j is at attempt 2 (fenced)", 2, 1);
  ASSERT_TRUE(HasErrorReason(fenced, error_reason::kAttemptFenced));
  const grpc::Status g = ToGrpcStatus(fenced);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(g.error_message(), fenced.message());
  ASSERT_FALSE(g.error_details().empty());

  const absl::Status back = FromGrpcStatus(g);
  EXPECT_EQ(back.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(back.message(), fenced.message());
  EXPECT_TRUE(HasErrorReason(back, error_reason::kAttemptFenced));
  std::optional<ErrorInfo> info = GetErrorInfo(back);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->domain, kErrorDomain);
  EXPECT_EQ(info->IntMetadata("job_attempt"), 2);
  EXPECT_EQ(info->IntMetadata("worker_attempt"), 1);
  EXPECT_EQ(*info, *GetErrorInfo(fenced));
}

// The details are a google.rpc.Status (code 1, message 2, details 3) holding an Any of type
// google.rpc.ErrorInfo (reason 1, domain 2, metadata 3): what any gRPC client's status-details
// helper parses.
TEST(GrpcStatusTest, DetailsAreAGoogleRpcStatusWithAnErrorInfo) {
  const grpc::Status g = ToGrpcStatus(AttemptFencedError("fenced", 3, 2));
  v1::RpcStatus rpc;
  ASSERT_TRUE(rpc.ParseFromString(g.error_details()));
  EXPECT_EQ(rpc.code(), static_cast<int>(grpc::StatusCode::ABORTED));
  EXPECT_EQ(rpc.message(), "fenced");
  ASSERT_EQ(rpc.details_size(), 1);
  EXPECT_EQ(rpc.details(0).type_url(), "type.googleapis.com/google.rpc.ErrorInfo");
  v1::ErrorInfo wire;
  ASSERT_TRUE(wire.ParseFromString(rpc.details(0).value()));
  EXPECT_EQ(wire.reason(), "ATTEMPT_FENCED");
  EXPECT_EQ(wire.domain(), "latchkey.v1");
  EXPECT_EQ(wire.metadata().at("job_attempt"), "3");
  EXPECT_EQ(wire.metadata().at("worker_attempt"), "2");
}

TEST(GrpcStatusTest, ForeignOrBrokenDetailsAreIgnored) {
  const grpc::Status garbage(grpc::StatusCode::ABORTED, "x", std::string("\xff\xff\xff", 3));
  const absl::Status a = FromGrpcStatus(garbage);
  EXPECT_EQ(a.code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(GetErrorInfo(a).has_value());

  v1::RpcStatus rpc;
  rpc.set_code(10);
  google::protobuf::Any* any = rpc.add_details();
  any->set_type_url("type.googleapis.com/google.rpc.RetryInfo");
  any->set_value("ignored");
  const absl::Status b =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::ABORTED, "y", rpc.SerializeAsString()));
  EXPECT_EQ(b.message(), "y");
  EXPECT_FALSE(GetErrorInfo(b).has_value());
}

TEST(GrpcStatusTest, OtherReasonsAndDomainsSurvive) {
  ErrorInfo info;
  info.reason = error_reason::kSessionClosed;
  const absl::Status closed = WithErrorInfo(absl::FailedPreconditionError("session closed"), info);
  const absl::Status back = FromGrpcStatus(ToGrpcStatus(closed));
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(HasErrorReason(back, error_reason::kSessionClosed));
  EXPECT_FALSE(HasErrorReason(back, error_reason::kAttemptFenced));

  ErrorInfo other;
  other.reason = error_reason::kAttemptFenced;
  other.domain = "example.com";
  const absl::Status foreign =
      FromGrpcStatus(ToGrpcStatus(WithErrorInfo(absl::AbortedError("z"), other)));
  EXPECT_FALSE(HasErrorReason(foreign, error_reason::kAttemptFenced)) << "another domain's";
  EXPECT_EQ(GetErrorInfo(foreign)->domain, "example.com");
}

}  // namespace
}  // namespace latchkey
