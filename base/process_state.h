// Whether a peer process on this host is stopped (SIGSTOP, a debugger) or gone, for the
// messages of a collective that timed out: the transports record every rank's host and pid
// and, on a timeout, name the ranks on this host that /proc shows stopped, instead of the
// neighbour that was waiting for them.
#pragma once

#include <string>
#include <vector>

namespace tutti {

// One rank's process: hostIdentity() and pid (empty host: unknown).
struct PeerProcess {
  std::string host;
  int pid = 0;
};

// "host\npid" of this process, and its parse (a PeerProcess with an empty host when the
// text is not of that form: it comes from another process and is checked, not trusted).
std::string describeThisProcess();
PeerProcess parsePeerProcess(const std::string& text);

// For the ranks (index = world rank) on this host but this process: "world rank 2 (pid
// 4711) is stopped (state T in /proc/4711/stat: SIGSTOP or a debugger)", or "... has
// exited", joined by "; ". Empty when every such process runs (or none is known).
std::string describeStoppedPeers(const std::vector<PeerProcess>& peers, int self_rank);

}  // namespace tutti
