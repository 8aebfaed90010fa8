#include "base/process_state.h"

#include "base/host_identity.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tutti {

std::string describeThisProcess() {
  return hostIdentity() + "\n" + std::to_string(static_cast<long>(getpid()));
}

PeerProcess parsePeerProcess(const std::string& text) {
  PeerProcess peer;
  const size_t newline = text.rfind('\n');
  if (newline == std::string::npos || newline == 0) return peer;
  const std::string pid_text = text.substr(newline + 1);
  char* end = nullptr;
  errno = 0;
  const long pid = std::strtol(pid_text.c_str(), &end, 10);
  if (pid_text.empty() || errno != 0 || *end != '\0' || pid <= 0 || pid > (1L << 22))  // pid_max is at most 2^22
    return peer;
  peer.host = text.substr(0, newline);
  peer.pid = static_cast<int>(pid);
  return peer;
}

namespace {

// The state letter of /proc/<pid>/stat ('R', 'S', 'T', ...), or '\0' if it cannot be read.
char processState(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the command name may hold spaces and ')'
  if (paren == std::string::npos || paren + 2 >= stat.size()) return '\0';
  return stat[paren + 2];
}

}  // namespace

std::string describeStoppedPeers(const std::vector<PeerProcess>& peers, int self_rank) {
  const std::string here = hostIdentity();
  std::string text;
  for (size_t r = 0; r < peers.size(); ++r) {
    const PeerProcess& peer = peers[r];
    if (static_cast<int>(r) == self_rank || peer.host != here || peer.pid <= 0) continue;
    const std::string who =
        "world rank " + std::to_string(r) + " (pid " + std::to_string(peer.pid) + ")";
    const std::string stat = "/proc/" + std::to_string(peer.pid) + "/stat";
    const char state = processState(peer.pid);
    std::string what;
    if (state == 'T' || state == 't')
      what = who + " is stopped (state " + std::string(1, state) + " in " + stat +
             ": SIGSTOP or a debugger)";
    else if (state == '\0' || state == 'Z' || state == 'X')
      what = who + " has exited";
    if (what.empty()) continue;
    text += (text.empty() ? "" : "; ") + what;
  }
  return text;
}

}  // namespace tutti
