#include "common/host_port.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace latchkey {
namespace {

using ::testing::HasSubstr;

TEST(HostPortTest, PortsInRangeParseWholeAndOthersNameTheRule) {
  EXPECT_EQ(*ParsePort("0"), 0);
  EXPECT_EQ(*ParsePort("65535"), 65535);
  EXPECT_EQ(*ParsePort("-1", -1), -1);
  EXPECT_THAT(std::string(ParsePort("99999").status().message()),
              HasSubstr("port 99999 outside [0, 65535]"));
  EXPECT_THAT(std::string(ParsePort("-1").status().message()), HasSubstr("outside [0, 65535]"));
  EXPECT_THAT(std::string(ParsePort("12ab").status().message()), HasSubstr("is not a number"));
  EXPECT_FALSE(ParsePort("").ok());
  EXPECT_FALSE(ParsePort("1.5").ok());
}

TEST(HostPortTest, HostPortNeedsAHostAPortAndBracketsForIpv6) {
  for (const char* ok : {"127.0.0.1:0", "0.0.0.0:50051", "[::1]:50051", "coord.svc:1"}) {
    EXPECT_TRUE(CheckHostPort(ok).ok()) << ok;
  }
  const std::pair<const char*, const char*> bad[] = {
      {"127.0.0.1:99999", "outside [0, 65535]"},
      {"127.0.0.1", "is not HOST:PORT"},
      {":50051", "has no host"},
      {"::1:50051", "in brackets"},
      {"host:port", "is not a number"},
  };
  for (const auto& [addr, says] : bad) {
    absl::Status st = CheckHostPort(addr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << addr;
    EXPECT_THAT(std::string(st.message()), HasSubstr(says)) << addr;
  }
}

TEST(HostPortTest, NumbersParseWholeOrNotAtAll) {
  EXPECT_EQ(*ParseNumber("2e10"), 2e10);
  EXPECT_EQ(*ParseInteger("-7"), -7);
  EXPECT_FALSE(ParseNumber("abc").ok());
  EXPECT_FALSE(ParseNumber("5s").ok());
  EXPECT_FALSE(ParseInteger("5.0").ok());
  EXPECT_THAT(std::string(ParseInteger("x").status().message()), HasSubstr("not an integer"));
}

}  // namespace
}  // namespace latchkey
