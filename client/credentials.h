// The user's credentials file: $XDG_CONFIG_HOME/latchkey/credentials (default
// ~/.config/latchkey/credentials), a JSON object keyed by coordinator address:
//
//   {"127.0.0.1:50051": {"token": "9f2c...", "tls_ca": "/home/me/runs/up-1/ca.pem"}}
//
// `latchkey up` writes the entry of the coordinator it starts (the file mode 0600, its folder
// 0700); the CLI reads the entry of --coordinator whenever neither --token nor LATCHKEY_TOKEN
// is given. Also: random tokens and their SHA-256 (what an --auth-tokens file holds).
#ifndef LATCHKEY_CLIENT_CREDENTIALS_H_
#define LATCHKEY_CLIENT_CREDENTIALS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sha256.h"

namespace latchkey {

struct StoredCredentials {
  std::string token;
  std::string tls_ca;  // empty: plaintext
};

// $XDG_CONFIG_HOME/latchkey/credentials, else $HOME/.config/latchkey/credentials; "" when
// neither variable is set.
std::string DefaultCredentialsPath();

// `address` as the credentials file compares it: "dns:///" dropped, the host lowercased, and
// localhost, 127.0.0.1 and [::1] all "127.0.0.1" ("localhost:50051" -> "127.0.0.1:50051").
std::string NormalizeCoordinatorAddress(const std::string& address);

// The entry for `address` (exactly, else the first whose address normalizes alike); nullopt
// when the file or the entry does not exist. A file that is not a JSON object of objects:
// INVALID_ARGUMENT naming the file.
absl::StatusOr<std::optional<StoredCredentials>> LookupCredentials(const std::string& path,
                                                                   const std::string& address);

// Sets the entry for `address`, keeping the others; creates the folder (0700) and writes the
// file (0600) by rename, so a reader never sees half of it. Writers (Save, Remove) take
// `path`.lock (flock) around their read and write, so entries saved at once by several
// processes are all kept; UNAVAILABLE when the lock stays held for 10 s.
absl::Status SaveCredentials(const std::string& path, const std::string& address,
                             const StoredCredentials& credentials);

// The addresses the file has entries for, in file order; empty when it is missing or unreadable.
std::vector<std::string> CredentialsEntries(const std::string& path);

// Removes the entry for `address` when it still holds `token` (an entry a later run wrote under
// the same address stays). OK when there is no such entry.
absl::Status RemoveCredentials(const std::string& path, const std::string& address,
                               const std::string& token);

// `bytes` random bytes from /dev/urandom, in lowercase hex.
absl::StatusOr<std::string> RandomHexToken(int bytes = 32);

// Writes `text` to `path` with mode 0600 (created so, never readable by others in between).
absl::Status WritePrivateFile(const std::string& path, const std::string& text);

}  // namespace latchkey

#endif  // LATCHKEY_CLIENT_CREDENTIALS_H_
