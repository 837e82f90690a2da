#include "common/spec_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

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

bool WritableDir(const std::string& dir) { return ::access(dir.c_str(), W_OK | X_OK) == 0; }

// The folder the workers create (create_directories) and write: when it exists, a writable
// folder; else its nearest existing ancestor is one.
absl::Status CheckWritableFolder(const std::string& field, const std::string& path,
                                 const std::string& note) {
  const auto refused = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": cannot write '", path, "'", note, ": ", why));
  };
  std::filesystem::path p(path);
  while (true) {
    struct stat st {};
    if (stat(p.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return refused(p.string() == path ? std::string("it is not a folder")
                                          : absl::StrCat("'", p.string(), "' is not a folder"));
      }
      if (!WritableDir(p.string())) {
        const std::string why = std::strerror(errno);
        return refused(p.string() == path
                           ? why
                           : absl::StrCat("cannot create it in '", p.string(), "': ", why));
      }
      return absl::OkStatus();
    }
    if (errno != ENOENT && errno != ENOTDIR) return refused(std::strerror(errno));
    if (!p.has_relative_path()) return refused(std::strerror(errno));  // not even the root
    p = p.parent_path();
  }
}

}  // namespace

std::string MegatronCacheDir(const JobSpec& spec) {
  if (!spec.data.cache_dir.empty()) return spec.data.cache_dir;
  const std::string& first =
      spec.data.blend.empty() ? spec.data.path_prefix : spec.data.blend[0].path_prefix;
  const std::string dir = std::filesystem::path(first).parent_path().string();
  if (WritableDir(dir)) return (std::filesystem::path(dir) / "latchkey-index-cache").string();
  if (spec.checkpoint.enabled()) {
    return (std::filesystem::path(spec.checkpoint.dir) / "index-cache").string();
  }
  std::error_code ec;
  return (std::filesystem::temp_directory_path(ec) / "latchkey-index-cache").string();
}

absl::Status CheckSpecFiles(const JobSpec& spec) {
  if (!spec.data.tokens_file.empty()) {
    if (absl::Status st = CheckReadableFile("latchkey.data.tokens_file", spec.data.tokens_file);
        !st.ok()) {
      return st;
    }
  }
  if (spec.data.format == DataFormat::kMegatron) {
    std::vector<std::pair<std::string, std::string>> prefixes;  // (field, P)
    if (spec.data.blend.empty()) {
      prefixes.emplace_back("latchkey.data.path_prefix", spec.data.path_prefix);
    }
    for (size_t i = 0; i < spec.data.blend.size(); ++i) {
      prefixes.emplace_back(absl::StrCat("latchkey.data.blend[", i, "].path_prefix"),
                            spec.data.blend[i].path_prefix);
    }
    for (const auto& [field, prefix] : prefixes) {
      for (const char* ext : {".idx", ".bin"}) {
        if (absl::Status st = CheckReadableFile(field, prefix + ext); !st.ok()) return st;
      }
    }
    if (absl::Status st = CheckWritableFolder(
            "latchkey.data.cache_dir", MegatronCacheDir(spec),
            spec.data.cache_dir.empty() ? " (the default index cache folder)" : "");
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
