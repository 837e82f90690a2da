// Strict parsing of the addresses, ports and numbers that flags and environment variables give:
// a value that does not parse whole, or lies outside its range, is an error naming the rule
// (never truncated, wrapped or read as 0, as atoi and some libraries do).
#ifndef LATCHKEY_COMMON_HOST_PORT_H_
#define LATCHKEY_COMMON_HOST_PORT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace latchkey {

// A port number in [lowest, 65535]. INVALID_ARGUMENT: "port 'x' is not a number",
// "port 99999 outside [0, 65535]".
absl::StatusOr<int> ParsePort(absl::string_view text, int lowest = 0);
// HOST:PORT, HOST non-empty (IPv6 in brackets: "[::1]:50051"), PORT as ParsePort(…, 0).
absl::Status CheckHostPort(absl::string_view address);
// A whole decimal number ("1e3", "2.5", "-1"); INVALID_ARGUMENT "'x' is not a number".
absl::StatusOr<double> ParseNumber(absl::string_view text);
// A whole decimal integer; INVALID_ARGUMENT "'x' is not an integer".
absl::StatusOr<long long> ParseInteger(absl::string_view text);

}  // namespace latchkey

#endif  // LATCHKEY_COMMON_HOST_PORT_H_
