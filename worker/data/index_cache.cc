#include "worker/data/index_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace latchkey {
namespace {

constexpr char kMagic[] = "LKIDXC01";  // 8 bytes
constexpr size_t kSumChars = 64;

void PutU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }

std::string Serialize(const std::string& description, const IndexArrays& arrays) {
  std::string out(kMagic, 8);
  PutU64(&out, description.size());
  out += description;
  PutU64(&out, arrays.size());
  for (const std::vector<int64_t>& a : arrays) {
    PutU64(&out, a.size());
    out.append(reinterpret_cast<const char*>(a.data()), a.size() * sizeof(int64_t));
  }
  out += Sha256Hex(out);
  return out;
}

// The arrays of `bytes` when it is a whole, matching cache file (else false).
bool Parse(const std::string& bytes, const std::string& description, IndexArrays* arrays) {
  if (bytes.size() < 8 + 8 + 8 + kSumChars || bytes.compare(0, 8, kMagic, 8) != 0) return false;
  const size_t body = bytes.size() - kSumChars;
  if (Sha256Hex(absl::string_view(bytes.data(), body)) != bytes.substr(body)) return false;
  size_t pos = 8;
  auto get = [&](uint64_t* v) {
    if (body - pos < 8) return false;
    std::memcpy(v, bytes.data() + pos, 8);
    pos += 8;
    return true;
  };
  uint64_t n = 0;
  if (!get(&n) || n > body - pos || bytes.compare(pos, n, description) != 0 ||
      n != description.size()) {
    return false;
  }
  pos += n;
  uint64_t count = 0;
  if (!get(&count)) return false;
  arrays->clear();
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t len = 0;
    if (!get(&len) || len > (body - pos) / 8) return false;
    std::vector<int64_t> a(len);
    std::memcpy(a.data(), bytes.data() + pos, len * 8);
    pos += len * 8;
    arrays->push_back(std::move(a));
  }
  return pos == body;
}

// Holds an exclusive flock for its lifetime.
class FileLock {
 public:
  explicit FileLock(int fd) : fd_(fd) {}
  ~FileLock() {
    if (fd_ >= 0) {
      ::flock(fd_, LOCK_UN);
      ::close(fd_);
    }
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<CacheResult> LoadOrBuildIndex(
    const std::string& dir, const std::string& description,
    const std::function<absl::StatusOr<IndexArrays>()>& build) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("latchkey.data.cache_dir: cannot create '", dir, "': ", ec.message()));
  }
  CacheResult r;
  r.path =
      (std::filesystem::path(dir) / (Sha256Hex(description).substr(0, 32) + ".lkidx")).string();
  const std::string lock_path = r.path + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("latchkey.data.cache_dir: cannot create '",
                                                    lock_path, "': ", std::strerror(errno)));
  }
  FileLock lock(fd);
  while (::flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("cannot lock '", lock_path, "': ", std::strerror(errno)));
    }
  }
  {
    std::ifstream in(r.path, std::ios::binary | std::ios::ate);
    if (in) {
      // One read of the whole file (it is checksummed whole).
      std::string bytes(static_cast<size_t>(std::max<std::streamoff>(0, in.tellg())), '\0');
      in.seekg(0);
      in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      if (in && Parse(bytes, description, &r.arrays)) return r;
      r.refused = true;  // a torn or altered file: never used, rebuilt below
    }
  }
  auto arrays = build();
  if (!arrays.ok()) return arrays.status();
  r.arrays = *std::move(arrays);
  r.built = true;
  const std::string bytes = Serialize(description, r.arrays);
  const std::string tmp = absl::StrCat(r.path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return absl::PermissionDeniedError(
          absl::StrCat("latchkey.data.cache_dir: cannot write '", tmp, "'"));
    }
  }
  std::filesystem::rename(tmp, r.path, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("latchkey.data.cache_dir: cannot rename '", tmp,
                                            "' to '", r.path, "': ", ec.message()));
  }
  return r;
}

}  // namespace latchkey
