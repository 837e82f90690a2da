// Tests that need an installed tool (prometheus, chromium, openssl, curl, kubectl): without it a
// test skips, naming the tool and its package; in CI (the environment variable CI=true, which
// .ci/run sets) every such tool is part of the machine's contract, and its absence fails the test
// instead, so a missing package can never turn a suite green. Hardware a machine may lack (a
// GPU) is not a tool: those tests skip everywhere.
#ifndef LATCHKEY_TESTS_SUPPORT_TOOLS_H_
#define LATCHKEY_TESTS_SUPPORT_TOOLS_H_

#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/support/process.h"

namespace latchkey::testing {

inline bool HaveTool(const std::string& name) {
  return RunAndCapture({"sh", "-c", "command -v " + name}).exit_code == 0;
}

inline bool InCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::strcmp(ci, "true") == 0;
}

}  // namespace latchkey::testing

// Skips (or, with CI=true, fails) the current gtest test unless `tool` is on PATH. `package`
// names what provides it (e.g. "Debian package chromium").
#define LATCHKEY_REQUIRE_TOOL(tool, package)                                                \
  do {                                                                                      \
    if (!::latchkey::testing::HaveTool(tool)) {                                             \
      if (::latchkey::testing::InCi()) {                                                    \
        FAIL() << (tool) << " is not installed (" << (package) << "); CI=true requires it"; \
      }                                                                                     \
      GTEST_SKIP() << (tool) << " is not installed (" << (package) << ")";                  \
    }                                                                                       \
  } while (0)

// The same for a part of the build a test needs (e.g. the gloo backend): CI builds everything,
// so there its absence fails the test.
#define LATCHKEY_REQUIRE_BUILT(cond, what)                                          \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      if (::latchkey::testing::InCi()) FAIL() << (what) << "; CI=true requires it"; \
      GTEST_SKIP() << (what);                                                       \
    }                                                                               \
  } while (0)

#endif  // LATCHKEY_TESTS_SUPPORT_TOOLS_H_
