# Finds the interpreters the tutti.torch extension is built for, and what each one's torch needs.
#
# TUTTI_TORCH_PYTHONS lists the candidates. Under pip (scikit-build-core) it is the interpreter
# pip runs, i.e. the target environment's; otherwise Debian's /usr/bin/python3 and the test venv
# the set-up script creates (.venv-torch/bin/python), whichever exist. Each one whose torch imports
# becomes a variant named after torch's major version ("torch1", "torch2"; "torch2_13" when two
# interpreters have a torch 2); the first variant is
# the one `cmake --install` installs.
#
# pip's build isolation hides the target environment's site-packages from the build, and with it
# torch. The probe therefore runs the interpreter once as it is and, if torch does not import,
# once more with -E (ignoring PYTHONPATH and friends, which is how the isolation is set up), which
# sees the environment's own site-packages: plain `pip install .` builds against the torch that
# `python -c "import torch"` imports in that environment.
#
# Sets TUTTI_TORCH_VARIANTS (tags) and, for each tag, TUTTI_TORCH_<tag>_{PYTHON,VERSION,INCLUDES,
# LIBDIR,PYTHON_INCLUDE,EXT_SUFFIX,PURELIB_LOCAL,DEFINES}; TUTTI_TORCH_FOUND; and
# TUTTI_TORCH_MISSING, the reason when nothing was found.

if(SKBUILD)
  set(_default_pythons ${Python3_EXECUTABLE} ${Python_EXECUTABLE})
  list(REMOVE_DUPLICATES _default_pythons)
else()
  set(_default_pythons /usr/bin/python3 ${PROJECT_SOURCE_DIR}/.venv-torch/bin/python)
endif()
set(TUTTI_TORCH_PYTHONS "${_default_pythons}" CACHE STRING
    "Interpreters to build the tutti.torch extension for (each against the torch it imports)")

function(_tutti_torch_probe python out_ok out_text)
  set(probe ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/torch_probe.py)
  foreach(flags "" "-E")
    execute_process(COMMAND ${python} ${flags} ${probe}
                    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0)
      set(${out_ok} ON PARENT_SCOPE)
      set(${out_text} "${out}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  string(REGEX REPLACE ".*\n" "" err "${err}")  # the last line: the exception
  set(${out_ok} OFF PARENT_SCOPE)
  set(${out_text} "${err}" PARENT_SCOPE)
endfunction()

set(TUTTI_TORCH_VARIANTS)
set(_torch_problems)
foreach(python IN LISTS TUTTI_TORCH_PYTHONS)
  if(NOT EXISTS ${python})
    list(APPEND _torch_problems "${python} does not exist")
    continue()
  endif()
  _tutti_torch_probe(${python} _ok _text)
  if(NOT _ok)
    list(APPEND _torch_problems "${python} cannot import torch (${_text})")
    continue()
  endif()
  string(REPLACE "\n" ";" _lines "${_text}")
  set(_info)
  foreach(line IN LISTS _lines)
    string(REGEX MATCH "^([a-z_]+)=(.*)$" _ "${line}")
    string(TOUPPER "${CMAKE_MATCH_1}" _key)
    string(REPLACE "|" ";" _info_${_key} "${CMAKE_MATCH_2}")
  endforeach()
  set(tag torch${_info_MAJOR})
  if(tag IN_LIST TUTTI_TORCH_VARIANTS)  # e.g. Debian 13's torch 2.6 and the venv's 2.13
    string(REGEX MATCH "^[0-9]+\\.([0-9]+)" _ "${_info_VERSION}")
    set(tag ${tag}_${CMAKE_MATCH_1})
  endif()
  if(tag IN_LIST TUTTI_TORCH_VARIANTS)
    message(STATUS "Tutti: no second tutti.torch for torch ${_info_VERSION} (${python})")
    continue()
  endif()
  list(APPEND TUTTI_TORCH_VARIANTS ${tag})
  set(TUTTI_TORCH_${tag}_PYTHON ${python})
  foreach(key VERSION INCLUDES LIBDIR PYTHON_INCLUDE EXT_SUFFIX PURELIB_LOCAL DEFINES)
    set(TUTTI_TORCH_${tag}_${key} "${_info_${key}}")
  endforeach()
  message(STATUS "Tutti: torch ${_info_VERSION} for ${python} (variant ${tag})")
endforeach()

if(TUTTI_TORCH_VARIANTS)
  set(TUTTI_TORCH_FOUND ON)
else()
  set(TUTTI_TORCH_FOUND OFF)
endif()
foreach(problem IN LISTS _torch_problems)
  message(STATUS "Tutti: no tutti.torch for ${problem}")
endforeach()
string(REPLACE ";" "; " TUTTI_TORCH_MISSING "${_torch_problems}")
set(TUTTI_TORCH_MISSING "no usable torch: ${TUTTI_TORCH_MISSING}; install torch into that \
environment first (e.g. `pip install torch==2.13.0`, or Debian's python3-torch), or name the \
interpreter with -DTUTTI_TORCH_PYTHONS=/path/to/python")
