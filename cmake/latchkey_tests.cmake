# How a test is registered: every ctest entry carries exactly one tier label (docs/testing.md)
#   unit     in one process, seconds
#   process  real processes (workers, a coordinator binary, a forked peer), no full job
#   e2e      a coordinator and its workers running a job, or `latchkey up`
#   tool     needs a tool beyond the build: prometheus/promtool, chromium, kubectl, a Python venv
#   soak     long fault runs (minutes each)
# plus optional area labels (coordinator, observability, proto, security, deploy, hf, training).
# `scripts/test.sh --tier unit` runs one tier; the tiers_cover_every_test entry fails when an
# entry has no tier.
include_guard(GLOBAL)
include(GoogleTest)

set(LATCHKEY_TEST_TIERS unit process e2e tool soak)

function(_latchkey_check_tier tier where)
  if(NOT tier IN_LIST LATCHKEY_TEST_TIERS)
    message(FATAL_ERROR "${where}: TIER '${tier}' is not one of ${LATCHKEY_TEST_TIERS}")
  endif()
endfunction()

# latchkey_gtest(TARGET TIER <tier> [TIMEOUT <s>] [LABELS <area>...] [RUN_SERIAL])
# One ctest entry per gtest case of TARGET, so failures are named and ctest -j spreads them.
# gtest_discover_tests takes PROPERTIES as name/value pairs and flattens a list value, so the
# labels (a list) are set by a script of our own that ctest runs after the discovered tests'
# (TEST_INCLUDE_FILES, in order), over the list of names the discovery leaves in TARGET_TESTS.
function(latchkey_gtest target)
  cmake_parse_arguments(ARG "RUN_SERIAL" "TIER;TIMEOUT" "LABELS" ${ARGN})
  _latchkey_check_tier("${ARG_TIER}" "latchkey_gtest(${target})")
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(props TIMEOUT ${ARG_TIMEOUT})
  if(ARG_RUN_SERIAL)
    list(APPEND props RUN_SERIAL TRUE)
  endif()
  gtest_discover_tests(${target} DISCOVERY_TIMEOUT 60 TEST_LIST ${target}_TESTS
                       PROPERTIES ${props})
  set(labels ${ARG_TIER} ${ARG_LABELS})
  set(labels_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_labels.cmake")
  file(WRITE "${labels_file}"
       "foreach(t IN LISTS ${target}_TESTS)\n"
       "  set_tests_properties(\"\${t}\" PROPERTIES LABELS \"${labels}\")\n"
       "endforeach()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${labels_file}")
endfunction()

# latchkey_process_test(<name> SOURCES <file>... TIER <tier> [NEEDS coordinator cli worker]
#                       [LIBS <target>...] [TIMEOUT <s>] [LABELS <area>...] [RUN_SERIAL])
# A gtest binary that starts the latchkey binaries it NEEDS: it links the test-support library,
# is told their paths (LATCHKEY_COORDINATOR_BIN, LATCHKEY_CLI_BIN; the worker's path comes with
# tests/support) and is built after them.
function(latchkey_process_test name)
  cmake_parse_arguments(ARG "RUN_SERIAL" "TIER;TIMEOUT" "SOURCES;NEEDS;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE latchkey_test_support ${ARG_LIBS} GTest::gtest_main)
  foreach(need IN LISTS ARG_NEEDS)
    if(need STREQUAL "coordinator")
      target_compile_definitions(${name} PRIVATE
        LATCHKEY_COORDINATOR_BIN="$<TARGET_FILE:latchkey-coordinator>")
      add_dependencies(${name} latchkey-coordinator)
    elseif(need STREQUAL "cli")
      target_compile_definitions(${name} PRIVATE LATCHKEY_CLI_BIN="$<TARGET_FILE:latchkey_cli>")
      add_dependencies(${name} latchkey_cli)
    elseif(need STREQUAL "worker")
      add_dependencies(${name} latchkey-worker)
    else()
      message(FATAL_ERROR "latchkey_process_test(${name}): NEEDS '${need}' is not one of "
                          "coordinator, cli, worker")
    endif()
  endforeach()
  set(serial "")
  if(ARG_RUN_SERIAL)
    set(serial RUN_SERIAL)
  endif()
  latchkey_gtest(${name} TIER ${ARG_TIER} TIMEOUT ${ARG_TIMEOUT} LABELS ${ARG_LABELS} ${serial})
endfunction()

# latchkey_test_tier(<tier> <test>...): the tier of tests registered with add_test (a whole
# binary or a script as one entry), called in the directory that added them.
function(latchkey_test_tier tier)
  _latchkey_check_tier("${tier}" "latchkey_test_tier")
  foreach(test IN LISTS ARGN)
    if(NOT TEST ${test})
      message(FATAL_ERROR "latchkey_test_tier: no test '${test}' in ${CMAKE_CURRENT_SOURCE_DIR}")
    endif()
    set_property(TEST ${test} APPEND PROPERTY LABELS ${tier})
  endforeach()
endfunction()
