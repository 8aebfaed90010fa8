// Which machine this process runs on, as the core (topology at init) and the backends (shm
// and hierarchical set-up) compare it across ranks.
#pragma once

#include <string>

namespace tutti {

// This process's host: its host name (UTS namespace) and the kernel's boot id, so that two
// machines cloned with the same name still differ. Never contains '\n'.
std::string hostIdentity();

}  // namespace tutti
