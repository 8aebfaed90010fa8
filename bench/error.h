// tutti-bench's error: a message and the StatusCode it stands for. Thrown where the tool
// cannot go on (a bad flag, a failed op, a baseline call that failed); main() prints it.
#pragma once

#include <tutti/tutti.hpp>

#include <stdexcept>
#include <string>

namespace tutti {
namespace bench {

class Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

[[noreturn]] inline void throwError(StatusCode code, const std::string& message) {
  throw Error(code, message);
}

}  // namespace bench
}  // namespace tutti
