// Scratch folders for tests, made one way: a fresh, unique folder under $TMPDIR (or /tmp),
// removed when the ScopedTempDir goes out of scope (kept when LATCHKEY_KEEP_TEST_DIRS is set,
// for post-mortems). Header-only so unit tests beside the code can use it.
#ifndef LATCHKEY_TESTS_SUPPORT_TEMP_DIR_H_
#define LATCHKEY_TESTS_SUPPORT_TEMP_DIR_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace latchkey::testing {

// A new empty folder "<tmp>/latchkey-<name>-XXXXXX". Throws if it cannot be made.
inline std::string MakeTempDir(const std::string& name) {
  std::string tmpl =
      (std::filesystem::temp_directory_path() / ("latchkey-" + name + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw std::runtime_error("cannot create a temporary folder from " + tmpl);
  }
  return tmpl;
}

class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& name = "test") : path_(MakeTempDir(name)) {}
  ~ScopedTempDir() {
    if (std::getenv("LATCHKEY_KEEP_TEST_DIRS") == nullptr) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& child) const { return path_ + "/" + child; }

 private:
  std::string path_;
};

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_TEMP_DIR_H_
