# Finds the interpreter the tutti.tensorflow op library is built for, and what its TensorFlow
# needs (cmake/tf_probe.py: tf.sysconfig's compile and link flags), the way cmake/TuttiTorch.cmake
# finds torch's.
#
# TUTTI_TENSORFLOW_PYTHONS lists the candidates; the first whose TensorFlow imports is used.
# Under pip (scikit-build-core) it is the interpreter pip runs, i.e. the target environment's;
# otherwise the test venv the set-up script creates (.venv-torch/bin/python) and Debian's
# /usr/bin/python3. As for torch, the probe runs the interpreter as it is and, if TensorFlow
# does not import, once more with -E, which sees the environment's own site-packages under
# pip's build isolation.
#
# Sets TUTTI_TENSORFLOW_FOUND, TUTTI_TENSORFLOW_{PYTHON,VERSION,COMPILE_FLAGS,LINK_FLAGS} and
# TUTTI_TENSORFLOW_MISSING, the reason when nothing was found.

# Switched off (-DTUTTI_WITH_TENSORFLOW=OFF or the environment variable): no probe, which
# imports TensorFlow (seconds).
set(_tf_request "${TUTTI_WITH_TENSORFLOW}")
if((_tf_request STREQUAL "" OR _tf_request STREQUAL "AUTO") AND DEFINED ENV{TUTTI_WITH_TENSORFLOW})
  set(_tf_request "$ENV{TUTTI_WITH_TENSORFLOW}")
endif()
string(TOUPPER "${_tf_request}" _tf_request)
if(_tf_request MATCHES "^(0|OFF|NO|FALSE|N)$")
  set(TUTTI_TENSORFLOW_FOUND OFF)
  set(TUTTI_TENSORFLOW_MISSING "TensorFlow was not looked for (TUTTI_WITH_TENSORFLOW=OFF)")
  return()
endif()

if(SKBUILD)
  set(_default_tf_pythons ${Python3_EXECUTABLE} ${Python_EXECUTABLE})
  list(REMOVE_DUPLICATES _default_tf_pythons)
else()
  set(_default_tf_pythons ${PROJECT_SOURCE_DIR}/.venv-torch/bin/python /usr/bin/python3)
endif()
set(TUTTI_TENSORFLOW_PYTHONS "${_default_tf_pythons}" CACHE STRING
    "Interpreters to look for TensorFlow in (the first that imports it is built for)")

set(TUTTI_TENSORFLOW_FOUND OFF)
set(_tf_problems)
foreach(python IN LISTS TUTTI_TENSORFLOW_PYTHONS)
  if(NOT EXISTS ${python})
    list(APPEND _tf_problems "${python} does not exist")
    continue()
  endif()
  set(_tf_ok OFF)
  foreach(flags "" "-E")
    execute_process(COMMAND ${python} ${flags} ${CMAKE_CURRENT_LIST_DIR}/tf_probe.py
                    OUTPUT_VARIABLE _tf_out ERROR_VARIABLE _tf_err RESULT_VARIABLE _tf_rc
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if(_tf_rc EQUAL 0)
      set(_tf_ok ON)
      break()
    endif()
  endforeach()
  if(NOT _tf_ok)
    string(REGEX REPLACE ".*\n" "" _tf_err "${_tf_err}")  # the last line: the exception
    list(APPEND _tf_problems "${python} cannot import tensorflow (${_tf_err})")
    continue()
  endif()
  string(REPLACE "\n" ";" _lines "${_tf_out}")
  foreach(line IN LISTS _lines)
    if(line MATCHES "^([a-z_]+)=(.*)$")
      string(TOUPPER "${CMAKE_MATCH_1}" _key)
      string(REPLACE "|" ";" TUTTI_TENSORFLOW_${_key} "${CMAKE_MATCH_2}")
    endif()
  endforeach()
  set(TUTTI_TENSORFLOW_PYTHON ${python})
  set(TUTTI_TENSORFLOW_FOUND ON)
  message(STATUS "Tutti: TensorFlow ${TUTTI_TENSORFLOW_VERSION} for ${python}")
  break()
endforeach()

if(NOT TUTTI_TENSORFLOW_FOUND)
  foreach(problem IN LISTS _tf_problems)
    message(STATUS "Tutti: no tutti.tensorflow for ${problem}")
  endforeach()
endif()
string(REPLACE ";" "; " TUTTI_TENSORFLOW_MISSING "${_tf_problems}")
set(TUTTI_TENSORFLOW_MISSING "no usable TensorFlow: ${TUTTI_TENSORFLOW_MISSING}; install it \
into that environment first (e.g. `pip install tensorflow-cpu==2.21.0`), or name the \
interpreter with -DTUTTI_TENSORFLOW_PYTHONS=/path/to/python")
