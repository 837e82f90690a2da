#include "common/spec_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace latchkey {
namespace {

absl::Status Refused(const std::string& field, const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read '", path, "': ", why));
}

// Opened, not only stat'ed: permissions, ACLs and a dangling symlink all show as they will to
// the worker that opens it.
absl::Status CheckReadableFile(const std::string& field, const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Refused(field, path, std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return Refused(field, path, "it is a folder, not a file");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Refused(field, path, std::strerror(errno));
  close(fd);
  return absl::OkStatus();
}

absl::Status CheckReadableFolder(const std::string& field, const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Refused(field, path, std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return Refused(field, path, "it is not a folder");
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return Refused(field, path, std::strerror(errno));
  closedir(d);
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSpecFiles(const JobSpec& spec) {
  if (!spec.data.tokens_file.empty()) {
    if (absl::Status st = CheckReadableFile("latchkey.data.tokens_file", spec.data.tokens_file);
        !st.ok()) {
      return st;
    }
  }
  if (!spec.eval.tokens_file.empty()) {  // a Megatron split needs no file of its own
    if (absl::Status st = CheckReadableFile("latchkey.eval.tokens_file", spec.eval.tokens_file);
        !st.ok()) {
      return st;
    }
  }
  if (!spec.init_from.empty()) {
    if (absl::Status st = CheckReadableFolder("latchkey.init_from", spec.init_from); !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace latchkey
