// The training suites' ctest entries that rerun cases on another transport set
// LATCHKEY_TEST_BACKEND (tests/support/specs.h: the fixture specs' latchkey.backend). A build
// without that backend cannot run them: the case skips, and fails under CI=true.
#ifndef LATCHKEY_TESTS_TRAINING_TEST_BACKEND_H_
#define LATCHKEY_TESTS_TRAINING_TEST_BACKEND_H_

#include "tests/support/specs.h"
#include "tests/support/tools.h"

#ifdef LATCHKEY_WITH_GLOO
#define LATCHKEY_TEST_GLOO_BUILT true
#else
#define LATCHKEY_TEST_GLOO_BUILT false
#endif

#define LATCHKEY_REQUIRE_TEST_BACKEND()                                                            \
  LATCHKEY_REQUIRE_BUILT(LATCHKEY_TEST_GLOO_BUILT || ::latchkey::testing::TestBackend() != "gloo", \
                         "LATCHKEY_TEST_BACKEND=gloo: this build has no gloo backend "             \
                         "(no libgloo)")

#endif  // LATCHKEY_TESTS_TRAINING_TEST_BACKEND_H_
