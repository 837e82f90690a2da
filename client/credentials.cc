#include "client/credentials.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace latchkey {
namespace {

namespace fs = std::filesystem;

std::string Hex(const unsigned char* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[p[i] >> 4]);
    out.push_back(kDigits[p[i] & 15]);
  }
  return out;
}

// Holds `path`.lock exclusively (flock) while an entry is read, changed and written back:
// two `latchkey up` saving or removing their entries at once would otherwise each write back
// the file as it read it, and one entry would be lost. Waits at most kLockWait.
class FileLock {
 public:
  static constexpr std::chrono::seconds kLockWait{10};
  static absl::StatusOr<FileLock> Take(const std::string& path) {
    const std::string lock_path = path + ".lock";
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::PermissionDeniedError("credentials file: cannot open " + lock_path + ": " +
                                         std::strerror(errno));
    }
    const auto until = std::chrono::steady_clock::now() + kLockWait;
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if ((errno != EWOULDBLOCK && errno != EINTR) || std::chrono::steady_clock::now() > until) {
        const std::string why =
            errno == EWOULDBLOCK ? "held by another process for 10 s" : std::strerror(errno);
        ::close(fd);
        return absl::UnavailableError("credentials file: cannot lock " + lock_path + ": " + why);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return FileLock(fd);
  }
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

absl::StatusOr<nlohmann::json> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError("credentials file " + path + ": not a JSON object");
  }
  return j;
}

}  // namespace

std::string DefaultCredentialsPath() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg != nullptr && *xdg != 0) return std::string(xdg) + "/latchkey/credentials";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != 0) return std::string(home) + "/.config/latchkey/credentials";
  return "";
}

std::string NormalizeCoordinatorAddress(const std::string& address) {
  std::string a = address;
  if (a.rfind("dns:///", 0) == 0) a = a.substr(7);
  const size_t colon = a.rfind(':');
  std::string host = colon == std::string::npos ? a : a.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : a.substr(colon);
  for (char& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // One machine's loopback under its usual names is one coordinator.
  if (host == "localhost" || host == "127.0.0.1" || host == "[::1]" || host == "::1") {
    host = "127.0.0.1";
  }
  return host + port;
}

absl::StatusOr<std::optional<StoredCredentials>> LookupCredentials(const std::string& path,
                                                                   const std::string& address) {
  if (path.empty()) return std::nullopt;
  auto j = ReadFile(path);
  if (!j.ok()) return j.status();
  // The entry under the address as given, else under any spelling of the same address.
  std::string key = address;
  if (!j->contains(key)) {
    key.clear();
    const std::string wanted = NormalizeCoordinatorAddress(address);
    for (auto it = j->begin(); it != j->end(); ++it) {
      if (NormalizeCoordinatorAddress(it.key()) == wanted) {
        key = it.key();
        break;
      }
    }
    if (key.empty()) return std::nullopt;
  }
  const nlohmann::json& e = (*j)[key];
  if (!e.is_object() || (e.contains("token") && !e["token"].is_string()) ||
      (e.contains("tls_ca") && !e["tls_ca"].is_string())) {
    return absl::InvalidArgumentError("credentials file " + path + ": entry '" + key +
                                      "' is not {\"token\": STRING, \"tls_ca\": STRING}");
  }
  StoredCredentials c;
  c.token = e.value("token", "");
  c.tls_ca = e.value("tls_ca", "");
  return c;
}

std::vector<std::string> CredentialsEntries(const std::string& path) {
  std::vector<std::string> out;
  if (path.empty()) return out;
  auto j = ReadFile(path);
  if (!j.ok()) return out;
  for (auto it = j->begin(); it != j->end(); ++it) out.push_back(it.key());
  return out;
}

absl::Status RemoveCredentials(const std::string& path, const std::string& address,
                               const std::string& token) {
  if (path.empty()) return absl::OkStatus();
  if (!fs::exists(path)) return absl::OkStatus();
  auto lock = FileLock::Take(path);
  if (!lock.ok()) return lock.status();
  auto j = ReadFile(path);
  if (!j.ok()) return j.status();
  auto it = j->find(address);
  if (it == j->end()) return absl::OkStatus();
  // Another `up` may have been given the same address since: its entry stays.
  if (!it->is_object() || it->value("token", "") != token) return absl::OkStatus();
  j->erase(it);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  if (absl::Status st = WritePrivateFile(tmp, j->dump(2) + "\n"); !st.ok()) return st;
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return absl::PermissionDeniedError("credentials file " + path + ": " + why);
  }
  return absl::OkStatus();
}

absl::Status SaveCredentials(const std::string& path, const std::string& address,
                             const StoredCredentials& credentials) {
  if (path.empty()) {
    return absl::FailedPreconditionError(
        "credentials file: neither XDG_CONFIG_HOME nor HOME is set");
  }
  const fs::path dir = fs::path(path).parent_path();
  std::error_code ec;
  if (!fs::exists(dir)) {
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::PermissionDeniedError("credentials file: cannot create " + dir.string() + ": " +
                                         ec.message());
    }
    ::chmod(dir.c_str(), 0700);
  }
  auto lock = FileLock::Take(path);
  if (!lock.ok()) return lock.status();
  auto j = ReadFile(path);
  if (!j.ok()) return j.status();
  nlohmann::json entry = nlohmann::json::object();
  entry["token"] = credentials.token;
  if (!credentials.tls_ca.empty()) entry["tls_ca"] = credentials.tls_ca;
  (*j)[address] = entry;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  if (absl::Status st = WritePrivateFile(tmp, j->dump(2) + "\n"); !st.ok()) return st;
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return absl::PermissionDeniedError("credentials file " + path + ": " + why);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RandomHexToken(int bytes) {
  std::ifstream in("/dev/urandom", std::ios::binary);
  std::string raw(static_cast<size_t>(bytes), '\0');
  if (!in || !in.read(raw.data(), bytes)) {
    return absl::InternalError("cannot read /dev/urandom");
  }
  return Hex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

absl::Status WritePrivateFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError("cannot write " + path + ": " + std::strerror(errno));
  }
  ::fchmod(fd, 0600);  // an existing file keeps its mode under O_CREAT
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      return absl::PermissionDeniedError("cannot write " + path + ": " + why);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    return absl::PermissionDeniedError("cannot write " + path + ": " + std::strerror(errno));
  }
  return absl::OkStatus();
}

}  // namespace latchkey
