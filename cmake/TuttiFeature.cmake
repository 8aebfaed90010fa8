# tutti_feature(NAME FOUND DESCRIPTION MISSING)
#
# Decides whether the optional part TUTTI_WITH_<NAME> is built. The cache variable
# TUTTI_WITH_<NAME> is AUTO (the default), ON or OFF; when it is AUTO the environment variable
# of the same name decides (so `TUTTI_WITH_MPI=0 pip install .` works), and when that is unset
# too the part is built exactly when its dependency was found (FOUND). Forcing a part on whose
# dependency is missing stops the configure with a message naming what is missing (MISSING).
# Sets the normal variable TUTTI_WITH_<NAME> to ON or OFF in the caller's scope.
function(tutti_feature name found description missing)
  set(var TUTTI_WITH_${name})
  set(${var} AUTO CACHE STRING "${description}: AUTO (when found), ON or OFF")
  set_property(CACHE ${var} PROPERTY STRINGS AUTO ON OFF)
  set(request "${${var}}")
  set(origin "-D${var}")
  if(request STREQUAL "AUTO" AND DEFINED ENV{${var}} AND NOT "$ENV{${var}}" STREQUAL "")
    set(request "$ENV{${var}}")
    set(origin "environment variable ${var}")
  endif()
  string(TOUPPER "${request}" request)
  if(request STREQUAL "AUTO")
    if(${found})
      set(value ON)
    else()
      set(value OFF)
    endif()
  elseif(request MATCHES "^(1|ON|YES|TRUE|Y)$")
    if(NOT ${found})
      message(FATAL_ERROR "Tutti: ${origin}=${request} asks for ${description}, but ${missing}. "
                          "Install it, or set ${var}=0 to build without it.")
    endif()
    set(value ON)
  elseif(request MATCHES "^(0|OFF|NO|FALSE|N)$")
    set(value OFF)
  else()
    message(FATAL_ERROR "Tutti: ${origin}=${request}: expected AUTO, ON (1) or OFF (0)")
  endif()
  if(value)
    set(${var} ON PARENT_SCOPE)
  else()
    set(${var} OFF PARENT_SCOPE)
  endif()
endfunction()
