// The shm backend when a member process dies (SIGKILL) or stops (SIGSTOP) in the middle of
// allreduces: the survivors fail, naming it, within milliseconds (death) or at the
// deadline (stop), and nothing is left in /dev/shm. The members are forked processes that
// set up over a small socket control plane (a star around member 0); the test process
// kills one and reads what the others report. Launchers are not used: tuttirun and mpirun
// stop the whole job as soon as one rank dies, which would hide what the survivors see.
#include "backends/shm/shm_backend.h"

#include "test/catch.h"
#include "test/shm/shm_test_util.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <numeric>
#include <thread>

namespace tutti {
namespace {

// Blocking full reads and writes with a deadline (poll); false on EOF, error or timeout.
bool writeAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
bool readAll(int fd, void* data, size_t n, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int ms = static_cast<int>(std::max(0.0, secondsLeft(deadline)) * 1000);
    if (poll(&pfd, 1, ms) <= 0) return false;
    ssize_t k = read(fd, p, n);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
void sendText(int fd, const std::string& s) {
  uint64_t n = s.size();
  if (!writeAll(fd, &n, sizeof n) || !writeAll(fd, s.data(), s.size()))
    throwError(StatusCode::kBackend, "test control plane: write failed");
}
std::string receiveText(int fd, Deadline deadline) {
  uint64_t n = 0;
  std::string s;
  if (readAll(fd, &n, sizeof n, deadline) && n < (1u << 20)) {
    s.resize(n);
    if (readAll(fd, &s[0], n, deadline)) return s;
  }
  throwError(StatusCode::kTimeout, "test control plane: read failed");
}

// Gather and broadcast over one socket between member 0 and each other member.
class SocketControlPlane : public ControlPlane {
 public:
  SocketControlPlane(int rank, int size, std::vector<int> fds)
      : rank_(rank), size_(size), fds_(std::move(fds)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::string> gather(const std::string& bytes, Deadline deadline) override {
    if (rank_ != 0) return sendText(fds_[0], bytes), std::vector<std::string>();
    std::vector<std::string> all = {bytes};
    for (int r = 1; r < size_; ++r) all.push_back(receiveText(fds_[r], deadline));
    return all;
  }
  std::string broadcast(const std::string& bytes, Deadline deadline) override {
    if (rank_ != 0) return receiveText(fds_[0], deadline);
    for (int r = 1; r < size_; ++r) sendText(fds_[r], bytes);
    return bytes;
  }
  void allreduceAnd(std::vector<uint64_t>&, Deadline) override {
    throwError(StatusCode::kUnsupported, "not needed by the shm setup");
  }
  void abort(const std::string&) override {}

 private:
  int rank_, size_;
  std::vector<int> fds_;  // member 0: fds_[r] to member r; others: fds_[0] to member 0
};

struct Member {
  pid_t pid = -1;
  int report = -1;  // read end: "ready", then the member's outcome
};

// Forks `n` members that allreduce 1 MiB float32 tensors in a loop (deadline `deadline_s`
// per op, at most 20 s in all) and report "ready" after the first op, then the error that
// ended the loop.
std::vector<Member> startMembers(int n, double deadline_s) {
  std::vector<std::array<int, 2>> links(n);  // links[r]: member 0 <-> member r
  for (int r = 1; r < n; ++r) REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, links[r].data()) == 0);
  std::vector<Member> members(n);
  for (int r = 0; r < n; ++r) {
    int report[2];
    REQUIRE(pipe(report) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      close(report[0]);
      std::vector<int> fds(n, -1);
      for (int j = 1; j < n; ++j) fds[j] = r == 0 ? links[j][0] : (j == r ? links[j][1] : -1);
      if (r != 0) fds[0] = links[r][1];
      std::string outcome = "no error";
      try {
        SocketControlPlane control(r, n, fds);
        std::vector<int> world(n);
        std::iota(world.begin(), world.end(), 0);
        detail::ShmOptions options;
        auto backend = makeShmBackend(control, world, 0, options);
        if (!backend) throwError(StatusCode::kInternal, "no shm backend");
        std::vector<float> x(1 << 18, 1.0f);
        const Deadline end = deadlineAfter(20);
        for (int i = 0; i < 1000000 && Clock::now() < end; ++i) {
          backend->allreduce(x.data(), x.data(), static_cast<int64_t>(x.size()),
                             DataType::kFloat32, ReduceOp::kMax, deadlineAfter(deadline_s));
          if (i == 0) writeAll(report[1], "ready\n", 6);
        }
      } catch (const std::exception& e) {
        outcome = e.what();
      }
      writeAll(report[1], outcome.data(), outcome.size());
      _exit(0);
    }
    close(report[1]);
    members[r] = {pid, report[0]};
  }
  for (int r = 1; r < n; ++r) close(links[r][0]), close(links[r][1]);
  for (auto& m : members) {  // every member is in its loop
    char ready[6];
    REQUIRE(readAll(m.report, ready, 6, deadlineAfter(30)));
  }
  return members;
}

// The member's report (what ended its loop), read until EOF within `seconds`.
std::string outcome(const Member& m, double seconds) {
  std::string text;
  Deadline deadline = deadlineAfter(seconds);
  char buf[512];
  for (int i = 0; i < 1000; ++i) {
    pollfd pfd{m.report, POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(std::max(0.0, secondsLeft(deadline)) * 1000)) <= 0)
      return text + " [no end within the deadline]";
    ssize_t k = read(m.report, buf, sizeof buf);
    if (k <= 0) break;
    text.append(buf, static_cast<size_t>(k));
  }
  return text;
}

void reapAll(std::vector<Member>& members) {
  for (auto& m : members) {
    kill(m.pid, SIGKILL);
    waitpid(m.pid, nullptr, 0);
    close(m.report);
  }
}

TEST_CASE("shm: a member killed with SIGKILL mid-allreduce; the others fail at once naming it") {
  auto members = startMembers(3, 30.0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto killed_at = Clock::now();
  REQUIRE(kill(members[1].pid, SIGKILL) == 0);
  std::string out0 = outcome(members[0], 10), out2 = outcome(members[2], 10);
  const double took = std::chrono::duration<double>(Clock::now() - killed_at).count();
  const std::string victim = "world rank 1 (pid " + std::to_string(members[1].pid) + ") died";
  reapAll(members);
  INFO("member 0: " << out0 << "\nmember 2: " << out2 << "\nafter " << took << " s");
  CHECK(out0.find(victim) != std::string::npos);
  CHECK(out2.find(victim) != std::string::npos);
  CHECK(took < 5.0);  // the op deadline is 30 s: liveness, not the deadline, ended it
  CHECK(test::shmNamesOf(members[0].pid).empty());
}

TEST_CASE("shm: a stopped member (SIGSTOP) fails the others at the deadline, naming it") {
  auto members = startMembers(2, 1.0);
  REQUIRE(kill(members[1].pid, SIGSTOP) == 0);
  std::string out0 = outcome(members[0], 10);
  reapAll(members);
  INFO("member 0: " << out0);
  CHECK(out0.find("timed out after") != std::string::npos);
  CHECK(out0.find("waiting for world rank 1 (pid " + std::to_string(members[1].pid) +
                  "), which is stopped") != std::string::npos);
  CHECK(test::shmNamesOf(members[0].pid).empty());
}

}  // namespace
}  // namespace tutti
