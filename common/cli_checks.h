// CLI11 validators shared by latchkey's binaries, so that a bad flag value is refused with the
// flag, the value and the rule ("--listen: port 99999 outside [0, 65535]") instead of being
// truncated or wrapped by the library that takes it.
#ifndef LATCHKEY_COMMON_CLI_CHECKS_H_
#define LATCHKEY_COMMON_CLI_CHECKS_H_

#include <string>

#include "CLI/CLI.hpp"
#include "common/host_port.h"

namespace latchkey::cli {

// HOST:PORT (an IPv6 host in brackets) with PORT in [0, 65535] (0: any free port).
inline CLI::Validator HostPort() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        absl::Status st = CheckHostPort(value);
        return st.ok() ? std::string() : std::string(st.message());
      },
      "HOST:PORT");
}

// A port in [lowest, 65535] (lowest -1: "off" is allowed, 0: any free port).
inline CLI::Validator Port(int lowest) {
  return CLI::Validator(
      [lowest](std::string& value) -> std::string {
        absl::StatusOr<int> port = ParsePort(value, lowest);
        return port.ok() ? std::string() : std::string(port.status().message());
      },
      "PORT");
}

// A number > 0 (strict: false) or >= 0 (strict: true is "positive").
inline CLI::Validator Positive() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        absl::StatusOr<double> v = ParseNumber(value);
        if (!v.ok()) return std::string(v.status().message());
        return *v > 0 ? std::string() : "must be > 0, got " + value;
      },
      "> 0");
}
inline CLI::Validator NonNegative() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        absl::StatusOr<double> v = ParseNumber(value);
        if (!v.ok()) return std::string(v.status().message());
        return *v >= 0 ? std::string() : "must be >= 0, got " + value;
      },
      ">= 0");
}

}  // namespace latchkey::cli

#endif  // LATCHKEY_COMMON_CLI_CHECKS_H_
