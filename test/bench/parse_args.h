// tutti-bench's flag parser on a command line written as a list, for the bench's unit tests.
#pragma once

#include <vector>

#include "bench/options.h"

namespace tutti {
namespace bench {

inline Options parse(std::vector<const char*> args) {
  args.insert(args.begin(), "tutti-bench");
  return parseOptions(static_cast<int>(args.size()), args.data());
}

}  // namespace bench
}  // namespace tutti
