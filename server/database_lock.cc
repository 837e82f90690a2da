#include "server/database_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace latchkey {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// What the holder wrote (its first line), or a note that it wrote nothing yet.
std::string Holder(int fd) {
  char buf[512] = {};
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "a coordinator that has not named itself yet";
  std::string s(buf, static_cast<size_t>(n));
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace

absl::StatusOr<DatabaseLock> DatabaseLock::Acquire(const std::string& db_path) {
  if (db_path.empty() || db_path == ":memory:") return DatabaseLock(-1, "");
  const std::string path = db_path + ".lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("--db ", db_path, ": cannot open its lock file ",
                                               path, ": ", std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      const std::string holder = Holder(fd);
      close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "--db ", db_path, " is served by another coordinator (", holder, "; lock file ", path,
          "): one coordinator per database; stop that one first, or give this one another --db"));
    }
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("--db ", db_path, ": cannot lock ", path, ": ", std::strerror(err)));
  }
  const std::string me =
      absl::StrCat("host ", HostName(), ", pid ", getpid(), ", since ",
                   absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone()), "\n");
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("--db ", db_path, ": cannot write ", path, ": ", why));
  }
  return DatabaseLock(fd, path);
}

DatabaseLock::DatabaseLock(DatabaseLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

DatabaseLock& DatabaseLock::operator=(DatabaseLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

DatabaseLock::~DatabaseLock() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace latchkey
