#include "worker/checkpoint/files.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace latchkey {
namespace {

// The payload WithErrno attaches: the errno in decimal.
constexpr char kErrnoTypeUrl[] = "latchkey.dev/errno";

absl::Status ErrnoError(absl::string_view what, const std::string& path, int err) {
  std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return WithErrno(absl::NotFoundError(msg), err);
  if (err == EACCES || err == EPERM) return WithErrno(absl::PermissionDeniedError(msg), err);
  return WithErrno(absl::InternalError(msg), err);
}

// INTERNAL `msg` for a std::filesystem error, its errno attached when it is one (the standard
// library's system errors are errno values).
absl::Status FsError(const std::string& msg, const std::error_code& ec) {
  absl::Status st = absl::InternalError(msg);
  if (ec.category() != std::system_category() && ec.category() != std::generic_category()) {
    return st;
  }
  return WithErrno(st, ec.value());
}

// The folder holding `path` ("." for a bare name, "/" for a file in the root).
std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  std::random_device rd;
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", rd());

  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", tmp, errno);
  auto fail = [&](absl::string_view what, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoError(what, tmp, err);
  };
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t w = ::write(fd, contents.data() + done, contents.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      return fail("cannot write", errno);
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) return fail("cannot fsync", errno);
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0) return fail("cannot close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(absl::StrCat("cannot rename ", tmp, " to"), path, err);
  }
  // Make the rename itself durable.
  int dfd = ::open(ParentDir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError("cannot stat", path, err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory, not a file"));
  }
  std::string out;
  out.reserve(st.st_size > 0 ? static_cast<size_t>(st.st_size) : 0);
  char buf[1 << 16];
  while (true) {
    ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoError("cannot read", path, err);
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

absl::Status WithErrno(absl::Status status, int err) {
  if (status.ok()) return status;
  status.SetPayload(kErrnoTypeUrl, absl::Cord(std::to_string(err)));
  return status;
}

int StatusErrno(const absl::Status& status) {
  const auto payload = status.GetPayload(kErrnoTypeUrl);
  int err = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &err)) return 0;
  return err;
}

bool IsOutOfSpace(const absl::Status& status) {
  const int err = StatusErrno(status);
  return err == ENOSPC || err == EDQUOT || err == EFBIG;
}

absl::Status RemoveFileIfPresent(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("cannot remove", path, errno);
  }
  return absl::OkStatus();
}

absl::Status RemoveEmptyDirIfPresent(const std::string& dir) {
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("cannot remove folder", dir, errno);
  }
  return absl::OkStatus();
}

absl::Status CreateDirectories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return FsError(absl::StrCat("cannot create directory ", dir, ": ", ec.message()), ec);
  }
  return absl::OkStatus();
}

absl::StatusOr<PathKind> GetPathKind(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return PathKind::kMissing;
    return ErrnoError("cannot stat", path, err);
  }
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  if (S_ISDIR(st.st_mode)) return PathKind::kDirectory;
  return PathKind::kOther;
}

bool IsRegularFile(const std::string& path) {
  absl::StatusOr<PathKind> kind = GetPathKind(path);
  return kind.ok() && *kind == PathKind::kFile;
}

absl::Status FsyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open folder", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("cannot fsync folder", dir, err);
  return absl::OkStatus();
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return FsError(absl::StrCat("cannot remove ", path, ": ", ec.message()), ec);
  return absl::OkStatus();
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

}  // namespace latchkey
