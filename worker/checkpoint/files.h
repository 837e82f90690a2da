// The file-system operations of checkpoint folders, kept apart from the formats: whole-file
// reads, crash-safe (atomic) writes, and the questions a folder reader asks. POSIX underneath.
//
// Errors name the path: NOT_FOUND (missing), PERMISSION_DENIED, INVALID_ARGUMENT (a directory
// where a file was expected), INTERNAL (any other OS error, with strerror's text). An error of
// the OS also carries its errno as a payload (WithErrno), so that a caller can tell a full disk
// (IsOutOfSpace) from a failing one without reading the message.
//
// Thread-safety: all functions are reentrant. Concurrent WriteFileAtomically calls for the same
// path are safe (each writes its own temporary file); the last rename wins.
#ifndef LATCHKEY_WORKER_CHECKPOINT_FILES_H_
#define LATCHKEY_WORKER_CHECKPOINT_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace latchkey {

// Writes `contents` to a temporary file next to `path` (same folder, so the rename stays on one
// file system), fsyncs it, renames it over `path` and fsyncs the folder: a crash leaves either
// the old file or the new one, never a partial one. The folder must exist. On failure the
// temporary file is removed and `path` is untouched.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

// Reads a whole file. NOT_FOUND when missing; INVALID_ARGUMENT when it is a directory.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Creates `dir` and any missing parents (OK when it already exists). INTERNAL naming `dir`.
absl::Status CreateDirectories(const std::string& dir);

// What is at a path, following symlinks.
enum class PathKind { kMissing, kFile, kDirectory, kOther };
// kMissing for ENOENT; any other stat failure is an error naming the path.
absl::StatusOr<PathKind> GetPathKind(const std::string& path);
// True when `path` is (a symlink to) a regular file; false for anything else or any error.
bool IsRegularFile(const std::string& path);

// fsyncs the folder itself (its entries: a rename or removal in it becomes durable).
absl::Status FsyncDirectory(const std::string& dir);

// Removes `path` and everything under it (OK when it is missing). INTERNAL naming `path`.
absl::Status RemoveTree(const std::string& path);

// `status` with the errno `err` of the OS call that failed attached (a payload of its own, not
// an ErrorInfo: it is for the caller's decision and never travels further). OK stays OK.
absl::Status WithErrno(absl::Status status, int err);
// The errno attached by WithErrno; 0 when none is.
int StatusErrno(const absl::Status& status);
// True when `status` is an OS error that says the file system has no room for the write:
// ENOSPC (no space left), EDQUOT (quota exceeded) or EFBIG (file too large).
bool IsOutOfSpace(const absl::Status& status);

// Removes the file at `path`: OK when it is removed or was missing; else the OS error naming it.
absl::Status RemoveFileIfPresent(const std::string& path);
// Removes the empty folder `dir`: OK when it is removed or was missing; else the OS error naming
// it (ENOTEMPTY among them).
absl::Status RemoveEmptyDirIfPresent(const std::string& dir);

// `dir` + "/" + `name`, without doubling a trailing slash of `dir`.
std::string JoinPath(absl::string_view dir, absl::string_view name);

}  // namespace latchkey

#endif  // LATCHKEY_WORKER_CHECKPOINT_FILES_H_
