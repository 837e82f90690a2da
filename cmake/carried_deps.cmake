# abseil and OpenSSL: the installed packages (Debian's libabsl-dev, libssl-dev), else what
# scripts/gpu-deps.sh put in LATCHKEY_DEPS_DIR for a machine without Debian's C++ libraries (a GPU
# machine with a pip CUDA PyTorch, docs/gpu.md). Included after find_package(Torch), so carried
# abseil sources compile with the libtorch's flags (its _GLIBCXX_USE_CXX11_ABI among them).
# LATCHKEY_USE_CARRIED_DEPS uses the carried ones even where packages are installed: the GPU
# machine's build, reproduced on a development machine.
set(LATCHKEY_DEPS_DIR ${PROJECT_SOURCE_DIR}/.deps CACHE PATH
  "Pinned dependencies fetched by scripts/gpu-deps.sh (used only where none is installed)")
option(LATCHKEY_USE_CARRIED_DEPS "Use LATCHKEY_DEPS_DIR even where abseil and OpenSSL are installed" OFF)

if(NOT LATCHKEY_USE_CARRIED_DEPS)
  find_package(absl CONFIG QUIET)
endif()
if(NOT absl_FOUND)
  if(NOT EXISTS ${LATCHKEY_DEPS_DIR}/abseil-cpp/CMakeLists.txt)
    message(FATAL_ERROR "abseil not found: install libabsl-dev, or on a machine without Debian's "
      "C++ libraries carry ${LATCHKEY_DEPS_DIR} made by scripts/gpu-deps.sh (docs/gpu.md)")
  endif()
  # abseil's own code builds with its own warning flags: none of latchkey's -Werror.
  get_directory_property(_latchkey_options COMPILE_OPTIONS)
  set_directory_properties(PROPERTIES COMPILE_OPTIONS "")
  set(ABSL_PROPAGATE_CXX_STD ON)
  set(ABSL_ENABLE_INSTALL OFF)
  set(ABSL_BUILD_TESTING OFF)
  set(BUILD_TESTING OFF)
  add_subdirectory(${LATCHKEY_DEPS_DIR}/abseil-cpp ${CMAKE_BINARY_DIR}/abseil-cpp EXCLUDE_FROM_ALL)
  set_directory_properties(PROPERTIES COMPILE_OPTIONS "${_latchkey_options}")
  message(STATUS "abseil: building the carried sources in ${LATCHKEY_DEPS_DIR}/abseil-cpp")
endif()

if(NOT LATCHKEY_USE_CARRIED_DEPS)
  find_package(OpenSSL QUIET)
endif()
if(NOT OPENSSL_FOUND)
  set(_latchkey_ssl ${LATCHKEY_DEPS_DIR}/root/usr)
  if(NOT EXISTS ${_latchkey_ssl}/include/openssl/sha.h)
    message(FATAL_ERROR "OpenSSL headers not found: install libssl-dev, or carry "
      "${LATCHKEY_DEPS_DIR} made by scripts/gpu-deps.sh (docs/gpu.md)")
  endif()
  foreach(var OPENSSL_INCLUDE_DIR OPENSSL_CRYPTO_LIBRARY OPENSSL_SSL_LIBRARY)
    unset(${var} CACHE)
  endforeach()
  # Exactly the carried copy (no system folder), found again by every later find_package(OpenSSL).
  find_path(OPENSSL_INCLUDE_DIR openssl/sha.h PATHS ${_latchkey_ssl}/include NO_DEFAULT_PATH)
  find_library(OPENSSL_CRYPTO_LIBRARY crypto PATHS ${_latchkey_ssl}/lib
    PATH_SUFFIXES ${CMAKE_LIBRARY_ARCHITECTURE} x86_64-linux-gnu NO_DEFAULT_PATH)
  find_library(OPENSSL_SSL_LIBRARY ssl PATHS ${_latchkey_ssl}/lib
    PATH_SUFFIXES ${CMAKE_LIBRARY_ARCHITECTURE} x86_64-linux-gnu NO_DEFAULT_PATH)
  find_package(OpenSSL REQUIRED)
  # Debian keeps configuration.h in the multiarch folder, which the compiler does not search here.
  file(GLOB _latchkey_ssl_conf ${_latchkey_ssl}/include/*/openssl/configuration.h)
  foreach(conf ${_latchkey_ssl_conf})
    get_filename_component(dir ${conf} DIRECTORY)
    get_filename_component(dir ${dir} DIRECTORY)
    include_directories(SYSTEM ${dir})
  endforeach()
  message(STATUS "OpenSSL: the carried headers and ${OPENSSL_CRYPTO_LIBRARY}")
endif()
