# Finds the interpreter tutti.jax's XLA FFI library is built for, and jaxlib's FFI headers.
#
# TUTTI_JAX_PYTHONS lists the candidates, first usable one wins. Under pip (scikit-build-core)
# it is the interpreter pip runs, i.e. the target environment's; otherwise the test venv the
# set-up script creates (.venv-torch/bin/python, which scripts/setup.sh gives jax too) and
# Debian's /usr/bin/python3. As for torch (cmake/TuttiTorch.cmake), each candidate is probed as it
# is and, failing that, with -E, which sees the target environment's site-packages through
# pip's build isolation.
#
# The library needs only jaxlib's headers (jax.ffi.include_dir()): it links no jax library, so
# one build serves every jax whose FFI ABI is compatible with these headers.
#
# Sets TUTTI_JAX_FOUND, TUTTI_JAX_PYTHON, TUTTI_JAX_VERSION, TUTTI_JAX_INCLUDE, and
# TUTTI_JAX_MISSING, the reason when nothing was found.
if(SKBUILD)
  set(_jax_default_pythons ${Python3_EXECUTABLE} ${Python_EXECUTABLE})
  list(REMOVE_DUPLICATES _jax_default_pythons)
else()
  set(_jax_default_pythons ${PROJECT_SOURCE_DIR}/.venv-torch/bin/python /usr/bin/python3)
endif()
set(TUTTI_JAX_PYTHONS "${_jax_default_pythons}" CACHE STRING
    "Interpreters to look for jax in (the first that imports jax builds tutti.jax)")

set(TUTTI_JAX_FOUND OFF)
set(_jax_problems)
foreach(python IN LISTS TUTTI_JAX_PYTHONS)
  if(NOT EXISTS ${python})
    list(APPEND _jax_problems "${python} does not exist")
    continue()
  endif()
  set(_ok OFF)
  foreach(flags "" "-E")
    execute_process(COMMAND ${python} ${flags} ${CMAKE_CURRENT_LIST_DIR}/jax_probe.py
                    OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if(_rc EQUAL 0)
      set(_ok ON)
      break()
    endif()
  endforeach()
  if(NOT _ok)
    string(REGEX REPLACE ".*\n" "" _err "${_err}")
    list(APPEND _jax_problems "${python} cannot import jax (${_err})")
    continue()
  endif()
  string(REGEX MATCH "version=([^\n]*)" _ "${_out}")
  set(TUTTI_JAX_VERSION "${CMAKE_MATCH_1}")
  string(REGEX MATCH "include=([^\n]*)" _ "${_out}")
  set(TUTTI_JAX_INCLUDE "${CMAKE_MATCH_1}")
  set(TUTTI_JAX_PYTHON ${python})
  set(TUTTI_JAX_FOUND ON)
  message(STATUS "Tutti: jax ${TUTTI_JAX_VERSION} for ${python} (FFI headers ${TUTTI_JAX_INCLUDE})")
  break()
endforeach()
if(NOT TUTTI_JAX_FOUND)
  foreach(problem IN LISTS _jax_problems)
    message(STATUS "Tutti: no tutti.jax for ${problem}")
  endforeach()
endif()
string(REPLACE ";" "; " TUTTI_JAX_MISSING "${_jax_problems}")
set(TUTTI_JAX_MISSING "no usable jax: ${TUTTI_JAX_MISSING}; install jax into that environment \
first (e.g. `pip install jax==0.10.2`, as scripts/setup.sh does for .venv-torch), or name the \
interpreter with -DTUTTI_JAX_PYTHONS=/path/to/python")
