// main() of every Catch2 test binary that has no main of its own.
#define CATCH_CONFIG_RUNNER  // Catch2 2: compile the session here (Catch2 3 ignores it)
#include "test/catch.h"

int main(int argc, char** argv) { return Catch::Session().run(argc, argv); }
