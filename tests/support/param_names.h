// Names for the cases of a gtest suite parameterized on a bool, so a case reads as what it
// runs (".../Async", ".../Sync") rather than "/0" and "/1".
//
//   INSTANTIATE_TEST_SUITE_P(Mode, Suite, ::testing::Bool(), BoolParamName("Async", "Sync"));
#ifndef LATCHKEY_TESTS_SUPPORT_PARAM_NAMES_H_
#define LATCHKEY_TESTS_SUPPORT_PARAM_NAMES_H_

#include <gtest/gtest.h>

#include <string>

namespace latchkey::testing {

// The name generator: `if_true` for the case true, `if_false` for false.
inline auto BoolParamName(const char* if_true, const char* if_false) {
  return [if_true, if_false](const ::testing::TestParamInfo<bool>& info) {
    return std::string(info.param ? if_true : if_false);
  };
}

}  // namespace latchkey::testing

#endif  // LATCHKEY_TESTS_SUPPORT_PARAM_NAMES_H_
