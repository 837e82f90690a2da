# The build's identity for `--version` (latchkey, latchkey-coordinator, latchkey-worker): the
# interface library latchkey_version puts <build>/generated on the include path with
# latchkey_version.h (LATCHKEY_VERSION, LATCHKEY_GIT_COMMIT, LATCHKEY_TORCH_VERSION,
# LATCHKEY_CUDA_ENABLED). The libtorch version comes from find_package(Torch)'s Torch_VERSION,
# so the torch-free binaries say which libtorch their build used without including torch.
# The commit is read when CMake configures (and again whenever the checkout's HEAD moves, as
# .git/HEAD and the ref it names are configure dependencies).
set(LATCHKEY_VERSION "0.1.0")
set(LATCHKEY_GIT_COMMIT "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} OUTPUT_VARIABLE _lk_commit
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _lk_git_rc)
  if(_lk_git_rc EQUAL 0 AND _lk_commit)
    set(LATCHKEY_GIT_COMMIT "${_lk_commit}")
  endif()
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --git-dir
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} OUTPUT_VARIABLE _lk_git_dir
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_lk_git_dir)
    get_filename_component(_lk_git_dir "${_lk_git_dir}" ABSOLUTE BASE_DIR ${PROJECT_SOURCE_DIR})
    if(EXISTS "${_lk_git_dir}/HEAD")
      set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
        "${_lk_git_dir}/HEAD")
    endif()
  endif()
endif()
if(Torch_VERSION)
  set(LATCHKEY_TORCH_VERSION "${Torch_VERSION}")
else()
  set(LATCHKEY_TORCH_VERSION "none (built without libtorch)")
endif()
if(LATCHKEY_CUDA)
  set(LATCHKEY_CUDA_ENABLED 1)
  set(LATCHKEY_CUDA_WORD on)
else()
  set(LATCHKEY_CUDA_ENABLED 0)
  set(LATCHKEY_CUDA_WORD off)
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/latchkey_version.h.in
  ${CMAKE_BINARY_DIR}/generated/latchkey_version.h @ONLY)
add_library(latchkey_version INTERFACE)
target_include_directories(latchkey_version INTERFACE ${CMAKE_BINARY_DIR}/generated)
