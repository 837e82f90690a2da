#include "server/security.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace latchkey {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return false;
  *out = ss.str();
  return true;
}

}  // namespace

absl::StatusOr<std::string> ReadPemFile(const std::string& flag, const std::string& path,
                                        const std::string& kind) {
  std::string pem;
  if (!ReadFile(path, &pem)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot read"));
  }
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  bool ok = false;
  if (kind == "key") {
    EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
    ok = key != nullptr;
    EVP_PKEY_free(key);
  } else {
    X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    ok = cert != nullptr;
    X509_free(cert);
  }
  BIO_free(bio);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": not a PEM ",
                                                   kind == "key" ? "private key" : "certificate"));
  }
  return pem;
}

bool KeyMatchesCert(const std::string& cert_pem, const std::string& key_pem) {
  BIO* cb = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  BIO* kb = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  X509* cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
  const bool ok = cert && key && X509_check_private_key(cert, key) == 1;
  X509_free(cert);
  EVP_PKEY_free(key);
  BIO_free(cb);
  BIO_free(kb);
  return ok;
}

const char* RoleName(Role role) {
  switch (role) {
    case Role::kRead:
      return "read";
    case Role::kSubmit:
      return "submit";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

absl::StatusOr<TokenTable> TokenTable::Parse(const std::string& text, const std::string& source) {
  TokenTable table;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": line ", line_no, ": ", why));
    };
    if (f.size() != 3) return bad("expected ROLE NAME SHA256HEX");
    Entry e;
    if (f[0] == "admin") {
      e.principal.role = Role::kAdmin;
    } else if (f[0] == "submit") {
      e.principal.role = Role::kSubmit;
    } else if (f[0] == "read") {
      e.principal.role = Role::kRead;
    } else {
      return bad(absl::StrCat("role '", f[0], "' is not admin, submit or read"));
    }
    e.principal.name = std::string(f[1]);
    if (f[2].size() != 64 || !std::all_of(f[2].begin(), f[2].end(), absl::ascii_isxdigit)) {
      return bad("SHA256HEX: expected 64 hex digits (the token's SHA-256)");
    }
    e.sha256_hex = std::string(f[2]);
    absl::AsciiStrToLower(&e.sha256_hex);
    table.entries_.push_back(std::move(e));
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::string text;
  if (!ReadFile(path, &text)) {
    return absl::InvalidArgumentError(absl::StrCat("--auth-tokens ", path, ": cannot read"));
  }
  return Parse(text, "--auth-tokens " + path);
}

std::optional<Principal> TokenTable::Find(absl::string_view token) const {
  const std::string h = Sha256Hex(token);
  std::optional<Principal> found;
  for (const Entry& e : entries_) {  // no early exit
    if (ConstantTimeEquals(h, e.sha256_hex) && !found) found = e.principal;
  }
  return found;
}

std::optional<std::string> BearerToken(absl::string_view authorization) {
  absl::string_view v = absl::StripAsciiWhitespace(authorization);
  if (v.size() < 7 || !absl::EqualsIgnoreCase(v.substr(0, 7), "bearer ")) return std::nullopt;
  v = absl::StripAsciiWhitespace(v.substr(7));
  if (v.empty()) return std::nullopt;
  return std::string(v);
}

absl::Status Permit(const Principal& who, JobAccess access, const std::string& method,
                    const std::string& owner) {
  if (who.role == Role::kAdmin) return absl::OkStatus();
  if (access == JobAccess::kRead) return absl::OkStatus();
  if (who.role == Role::kRead) {
    return absl::PermissionDeniedError(
        absl::StrCat(method, ": token '", who.name, "' has role read; needs submit or admin"));
  }
  if (access == JobAccess::kSubmit) return absl::OkStatus();
  if (owner != who.name) {
    return absl::PermissionDeniedError(absl::StrCat(
        method, ": token '", who.name, "' (role submit) may change only the jobs it submitted; ",
        "this one was submitted by ", owner.empty() ? "(nobody named)" : "'" + owner + "'"));
  }
  return absl::OkStatus();
}

bool IsLoopbackListen(const std::string& listen) {
  std::string host = listen;
  if (absl::StartsWith(host, "[")) {
    host = host.substr(1, host.find(']') == std::string::npos ? 0 : host.find(']') - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  absl::AsciiStrToLower(&host);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

int PeerCallLimiter::limit() const {
  if (fixed_ > 0) return fixed_;
  const int ranks = live_ranks_ ? live_ranks_() : 0;
  return std::max(kMinCallsPerPeer, 4 * ranks + 16);
}

bool PeerCallLimiter::Acquire(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  int& n = open_[peer];
  // Below the smallest possible limit no one is asked; the live job count only matters beyond.
  if (n >= (fixed_ > 0 ? fixed_ : kMinCallsPerPeer) && n >= limit()) {
    if (n == 0) open_.erase(peer);
    return false;
  }
  ++n;
  return true;
}

void PeerCallLimiter::Release(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(peer);
  if (it == open_.end()) return;
  if (--it->second <= 0) open_.erase(it);
}

PeerCallLimiter::Slot::Slot(PeerCallLimiter* limiter, std::string peer)
    : limiter_(limiter), peer_(std::move(peer)) {
  held_ = limiter_ == nullptr || limiter_->Acquire(peer_);
}

PeerCallLimiter::Slot::~Slot() {
  if (held_ && limiter_) limiter_->Release(peer_);
}

}  // namespace latchkey
