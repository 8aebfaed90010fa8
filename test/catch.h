// Catch2 for the tests, whichever major version the machine has: Debian 12 ships Catch2 2
// (one header, catch2/catch.hpp), Debian 13 ships Catch2 3 (catch2/catch_all.hpp, with a few
// names moved). Test files include this instead of Catch2 directly and use the Catch2 2 names;
// test/CMakeLists.txt defines TUTTI_CATCH2_MAJOR.
#pragma once

#if TUTTI_CATCH2_MAJOR >= 3
#include <catch2/catch_all.hpp>
#include <catch2/internal/catch_stdstreams.hpp>

#include <string>

using Catch::Approx;

namespace Catch {
// Catch2 2's names for what Catch2 3 renamed. A class, not an alias, so that a listener
// deriving from it can name it unqualified (`using TestEventListenerBase::TestEventListenerBase`).
class TestEventListenerBase : public EventListenerBase {
 public:
  explicit TestEventListenerBase(IConfig const* config) : EventListenerBase(config) {}
};
inline Matchers::StringContainsMatcher Contains(const std::string& text) {
  return Matchers::ContainsSubstring(text);
}
}  // namespace Catch
#else
#include <catch2/catch.hpp>
#endif
