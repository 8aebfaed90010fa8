#include "base/host_identity.h"

#include <unistd.h>

#include <fstream>
#include <limits.h>

namespace tutti {

std::string hostIdentity() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::string id = std::string(name) + " " + boot;
  for (char& c : id)
    if (c == '\n') c = ' ';
  return id;
}

}  // namespace tutti
