// Helpers of the shm tests.
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace tutti {
namespace test {

// The names in /dev/shm of segments that process `creator` made (a set's root names its
// segments /tutti-<pid>-...): empty once every one was unlinked.
inline std::vector<std::string> shmNamesOf(pid_t creator) {
  std::vector<std::string> names;
  const std::string prefix = "tutti-" + std::to_string(creator) + "-";
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) names.push_back(e->d_name);
    closedir(d);
  }
  return names;
}

}  // namespace test
}  // namespace tutti
