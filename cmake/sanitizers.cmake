# TUTTI_SANITIZE: a sanitizer build of the library, the tests and the tools (docs/testing.md).
#   address  AddressSanitizer + UndefinedBehaviorSanitizer; any report aborts the process
#   thread   ThreadSanitizer (the threads-as-ranks unit tests)
# Both keep frame pointers and line tables (-g1) so reports have usable stacks; ASan + UBSan
# builds with -Og (UBSan's checks made -O1 compile 4x slower than plain -O2), TSan with -O1.
# scripts/sanitize.sh configures build-asan/ and build-tsan/ with them and runs the tests
# that matter.
set(TUTTI_SANITIZE "" CACHE STRING "Sanitizer build: address (ASan + UBSan), thread (TSan), or empty")
set_property(CACHE TUTTI_SANITIZE PROPERTY STRINGS "" address thread)

if(TUTTI_SANITIZE STREQUAL "address")
  set(_tutti_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=all)
  set(_tutti_sanitize_opt -Og)
elseif(TUTTI_SANITIZE STREQUAL "thread")
  set(_tutti_sanitize_flags -fsanitize=thread)
  set(_tutti_sanitize_opt -O1)
elseif(NOT TUTTI_SANITIZE STREQUAL "")
  message(FATAL_ERROR "TUTTI_SANITIZE must be address, thread or empty, got '${TUTTI_SANITIZE}'")
endif()

if(_tutti_sanitize_flags)
  add_compile_options(${_tutti_sanitize_flags} ${_tutti_sanitize_opt} -g1 -fno-omit-frame-pointer)
  add_link_options(${_tutti_sanitize_flags})
  message(STATUS "Tutti sanitizer build: ${TUTTI_SANITIZE}")
endif()
