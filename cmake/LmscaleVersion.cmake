# The git commit is stamped into every output file; computed at configure time.
find_package(Git QUIET)
set(LMSCALE_GIT_COMMIT "unknown")
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} describe --always --dirty --abbrev=12
                  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} OUTPUT_VARIABLE _c
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _r)
  if(_r EQUAL 0 AND _c)
    set(LMSCALE_GIT_COMMIT ${_c})
  endif()
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/version.h.in ${PROJECT_BINARY_DIR}/generated/lmscale/version.h @ONLY)
