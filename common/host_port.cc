#include "common/host_port.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace latchkey {

absl::StatusOr<int> ParsePort(absl::string_view text, int lowest) {
  int port = 0;
  if (!absl::SimpleAtoi(text, &port)) {
    return absl::InvalidArgumentError(absl::StrCat("port '", text, "' is not a number"));
  }
  if (port < lowest || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port ", port, " outside [", lowest, ", 65535]"));
  }
  return port;
}

absl::Status CheckHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not HOST:PORT"));
  }
  absl::string_view host = address.substr(0, colon);
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' has no host"));
  }
  const bool bracketed = host.front() == '[';
  if (bracketed != (host.back() == ']') ||
      (!bracketed && host.find(':') != absl::string_view::npos)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "': an IPv6 host goes in brackets, e.g. [::1]:50051"));
  }
  absl::StatusOr<int> port = ParsePort(address.substr(colon + 1), 0);
  if (!port.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "': ", port.status().message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> ParseNumber(absl::string_view text) {
  double v = 0;
  if (!absl::SimpleAtod(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a number"));
  }
  return v;
}

absl::StatusOr<long long> ParseInteger(absl::string_view text) {
  long long v = 0;
  if (!absl::SimpleAtoi(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not an integer"));
  }
  return v;
}

}  // namespace latchkey
