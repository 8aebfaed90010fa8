// docs/env_vars.md of the source tree, for the tests that check it against the config table.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "test/catch.h"

inline std::string envVarsDoc() {
  std::ifstream in(std::string(TUTTI_SOURCE_DIR) + "/docs/env_vars.md");
  REQUIRE(in.good());
  std::stringstream doc;
  doc << in.rdbuf();
  return doc.str();
}
