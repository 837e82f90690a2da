// The coordinator's security in one place: TLS files, role tokens (--auth-tokens), join-token
// hashing, the per-peer cap on in-flight calls, and the rule that decides who may do what.
// No gRPC here; the services (job_service.cc, worker_service.cc) call these. docs/protocol.md
// "Security" is the user-facing description.
// Thread-safety: TokenTable is immutable after Parse; PeerCallLimiter is thread-safe.
#ifndef LATCHKEY_SERVER_SECURITY_H_
#define LATCHKEY_SERVER_SECURITY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/sha256.h"

namespace latchkey {

// Equal without an early exit, so the time taken does not reveal a matching prefix.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Reads a PEM file for `flag` and checks that it parses: kind "cert" (one or more X.509
// certificates) or "key" (a private key). Errors name the flag and the file.
absl::StatusOr<std::string> ReadPemFile(const std::string& flag, const std::string& path,
                                        const std::string& kind);
// Whether `key_pem` is the private key of the first certificate in `cert_pem`.
bool KeyMatchesCert(const std::string& cert_pem, const std::string& key_pem);

enum class Role { kRead, kSubmit, kAdmin };
const char* RoleName(Role role);

struct Principal {
  Role role = Role::kRead;
  std::string name;
};

// The --auth-tokens file: lines `ROLE NAME SHA256HEX`; `#` lines and blank lines ignored.
class TokenTable {
 public:
  // `source` names the file in errors ("--auth-tokens F: line 3: ...").
  static absl::StatusOr<TokenTable> Parse(const std::string& text, const std::string& source);
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The principal whose hash matches SHA-256(token); every entry is compared in constant time.
  std::optional<Principal> Find(absl::string_view token) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Principal principal;
    std::string sha256_hex;  // lower case
  };
  std::vector<Entry> entries_;
};

// The token of an `authorization: Bearer TOKEN` value; nullopt when it is not one.
std::optional<std::string> BearerToken(absl::string_view authorization);

// What a JobService call needs.
enum class JobAccess {
  kRead,    // GetJob, ListJobs, WatchJob, ListLatches, GetTrace
  kSubmit,  // SubmitJob
  kModify,  // CancelJob, ResumeJob, UpdateJobPolicy: admin, or submit on a job it submitted
};

// OK, or PERMISSION_DENIED saying why. `owner`: the submitter of the job (kModify only).
absl::Status Permit(const Principal& who, JobAccess access, const std::string& method,
                    const std::string& owner);

// Whether a --listen address binds loopback only ("127.0.0.1:N", "localhost:N", "[::1]:N").
bool IsLoopbackListen(const std::string& listen);

// Calls and streams open per peer host. A fixed limit (> 0) is used as is; 0 derives it from the
// ranks of the coordinator's live jobs: max(kMinCallsPerPeer, 4 x live ranks + 16), since every
// rank holds a few calls and streams and all ranks on one host count under one peer.
class PeerCallLimiter {
 public:
  static constexpr int kMinCallsPerPeer = 64;
  // `live_ranks` (may be empty: 0) is asked only when a peer reaches kMinCallsPerPeer.
  explicit PeerCallLimiter(int fixed_limit, std::function<int()> live_ranks = nullptr)
      : fixed_(fixed_limit), live_ranks_(std::move(live_ranks)) {}
  bool Acquire(const std::string& peer);
  void Release(const std::string& peer);
  // The limit now (derived ones follow the live jobs).
  int limit() const;

  // Holds one slot for its lifetime (no slot when Acquire failed: ok() false).
  class Slot {
   public:
    Slot(PeerCallLimiter* limiter, std::string peer);
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    bool ok() const { return held_; }

   private:
    PeerCallLimiter* limiter_;
    std::string peer_;
    bool held_ = false;
  };

 private:
  const int fixed_;
  const std::function<int()> live_ranks_;
  absl::Mutex mu_;
  std::map<std::string, int> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace latchkey

#endif  // LATCHKEY_SERVER_SECURITY_H_
