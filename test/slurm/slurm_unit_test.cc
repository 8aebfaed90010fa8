// The pieces of gloo under srun that need no Slurm: the host list parser, the port, the
// secret, and the in-process rendezvous server (protocol 2) against the real C++ client,
// tuttirun's Python client and raw sockets: the proof of the secret (right, wrong, late),
// bad MAC, replay, oversized, malformed, BUSY (slots and bytes in flight) with the client's
// retries, and peers without the secret trying to exhaust its memory and slots.
#include "backends/gloo/rendezvous_client.h"
#include "backends/gloo/rendezvous_server.h"
#include "backends/gloo/rendezvous_wire.h"
#include "backends/gloo/slurm_rendezvous.h"
#include "base/common.h"
#include "test/catch.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace tutti;
using namespace tutti::detail;
using Hosts = std::vector<std::string>;

namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";  // 16 bytes once decoded

std::string raw() { return decodeHexSecret(kSecret); }

std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

// A raw TCP peer of the server: reads the hello, sends what a test builds, reads replies.
class Peer {
 public:
  explicit Peer(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  }
  ~Peer() { ::close(fd_); }
  // Bytes until `n` arrived, the peer closed, or 5 s passed.
  std::string read(size_t n, double seconds = 5) {
    std::string out;
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(int(seconds * 1000));
    while (out.size() < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, int(left.count())) <= 0) break;
      char buf[4096];
      ssize_t got = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (got <= 0) break;
      out.append(buf, got);
    }
    return out;
  }
  std::string hello() {
    const std::string h = read(kRendezvousHelloBytes);
    return h.size() == kRendezvousHelloBytes ? h.substr(5) : std::string();
  }
  // Reads the hello and sends the proof of `secret`; returns the nonce.
  std::string prove(const std::string& secret) {
    const std::string nonce = hello();
    send(rendezvousProof(secret, nonce));
    return nonce;
  }
  // prove(), and the server's OK; returns the nonce.
  std::string authenticate() {
    const std::string nonce = prove(raw());
    REQUIRE(reply().first == kRdzvOk);
    return nonce;
  }
  void send(const std::string& bytes) {
    ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  bool closedWithin(double seconds) {  // EOF (or reset) before `seconds`
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, int(seconds * 1000)) <= 0) return false;
    char c;
    return ::recv(fd_, &c, 1, MSG_PEEK) <= 0;
  }
  // A reply: status byte and payload.
  std::pair<int, std::string> reply() {
    std::string h = read(kRendezvousResponseHeaderBytes);
    if (h.size() != kRendezvousResponseHeaderBytes) return {-1, ""};
    std::string payload = read(getLittleEndian(&h[16], 8));
    read(kRendezvousMacBytes);
    return {static_cast<uint8_t>(h[4]), payload};
  }

 private:
  int fd_ = -1;
};

std::string header(uint8_t op, uint64_t seq, uint32_t timeout, uint32_t klen, uint64_t vlen) {
  std::string h = "TUTQ";
  h.push_back(static_cast<char>(op));
  h.append(3, '\0');
  putLittleEndian(h, seq, 8);
  putLittleEndian(h, timeout, 4);
  putLittleEndian(h, klen, 4);
  putLittleEndian(h, vlen, 8);
  return h;
}

std::string request(const std::string& secret, const std::string& nonce, uint8_t op,
                    uint64_t seq, const std::string& key, const std::string& value) {
  return rendezvousRequest(secret, nonce, op, seq, 0, key, value);
}

// The next reply is a refusal with `status` and a message containing `text`; then the
// server closes the connection.
void expectRefusal(Peer& p, int status, const std::string& text) {
  auto r = p.reply();
  CHECK(r.first == status);
  CHECK_THAT(r.second, Catch::Contains(text));
  CHECK(p.closedWithin(2));
}

// Waits (at most `seconds`) until `count()` is `n`.
template <typename Count>
bool waitFor(Count count, uint64_t n, double seconds = 2) {
  for (int i = 0; i < seconds * 50 && count() != n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return count() == n;
}

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

RendezvousServerOptions quick() {
  RendezvousServerOptions o;
  o.bind_host = "127.0.0.1";
  o.auth_seconds = 0.5;
  o.idle_seconds = 0.5;
  o.message_seconds = 2;
  return o;
}

}  // namespace

TEST_CASE("Slurm host lists expand in order") {
  CHECK(expandHostlist("vm", "L") == Hosts{"vm"});
  CHECK(expandHostlist("n[1-3,5]", "L") == Hosts{"n1", "n2", "n3", "n5"});
  CHECK(expandHostlist("n[08-10]", "L") == Hosts{"n08", "n09", "n10"});
  CHECK(expandHostlist("a,b[1-2]x,c", "L") == Hosts{"a", "b1x", "b2x", "c"});
  CHECK(expandHostlist("r[1-2]n[1-2]", "L") == Hosts{"r1n1", "r1n2", "r2n1", "r2n2"});
  CHECK(expandHostlist("gpu-[7],cpu-01", "L") == Hosts{"gpu-7", "cpu-01"});
  for (const char* bad : {"", "n[1-", "n[3-1]", "n[a]", "n[]", ",", "a,,b", "n]1", "n[1[2]]",
                          "n[1-2"}) {
    INFO(bad);
    CHECK_THROWS_AS(expandHostlist(bad, "L"), Error);
  }
  CHECK_THAT(thrown([] { expandHostlist("n[0-99999999]", "SLURM_STEP_NODELIST", 1000); }),
             Catch::Contains("SLURM_STEP_NODELIST='n[0-99999999]'") &&
                 Catch::Contains("more than 1000 hosts"));
}

TEST_CASE("the rendezvous port follows the job and step") {
  std::set<int> ports;
  for (int job = 1000; job < 1750; ++job)
    for (int step = 0; step < 16; ++step) {
      int port = slurmRendezvousPort(std::to_string(job), std::to_string(step));
      if (port < 20000 || port >= 32000) FAIL("port " << port);
      ports.insert(port);
    }
  CHECK(ports.size() == 750 * 16);  // consecutive jobs and their steps never share one
  CHECK(slurmRendezvousPort("42", "0") == slurmRendezvousPort("42", "0"));
  CHECK_THAT(thrown([] { slurmRendezvousPort("12_3", "0"); }),
             Catch::Contains("SLURM_JOB_ID='12_3'") &&
                 Catch::Contains("TUTTI_RENDEZVOUS_PORT"));
}

TEST_CASE("the secret comes from TUTTI_SECRET or a private ~/.tutti/secret") {
  BackendOptions options;
  options.secret = kSecret;
  CHECK(slurmSecret(options) == raw());
  options.secret = "abcd";
  CHECK_THAT(thrown([&] { slurmSecret(options); }), Catch::Contains("at least 16"));

  char dir[] = "/tmp/tutti-slurm-unit-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  options.secret.clear();
  options.slurm.home = dir;
  CHECK_THAT(thrown([&] { slurmSecret(options); }),
             Catch::Contains("no job secret") && Catch::Contains("openssl rand -hex 32"));
  const std::string sub = std::string(dir) + "/.tutti", file = sub + "/secret";
  ::mkdir(sub.c_str(), 0700);
  std::ofstream(file) << kSecret << "\n";
  ::chmod(file.c_str(), 0644);
  CHECK_THAT(thrown([&] { slurmSecret(options); }),
             Catch::Contains("mode 0644") && Catch::Contains("chmod 600 " + file));
  ::chmod(file.c_str(), 0600);
  CHECK(slurmSecret(options) == raw());
  ::unlink(file.c_str());
  ::rmdir(sub.c_str());
  ::rmdir(dir);
}

TEST_CASE("the in-process server serves the real client") {
  RendezvousServer server(raw(), quick());
  RendezvousClient a("127.0.0.1", server.port(), raw(), 5.0, 0);
  RendezvousClient b("127.0.0.1", server.port(), raw(), 5.0, 1);
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    a.set("k", {'v', '1'});
  });
  CHECK(b.get("k") == std::vector<char>{'v', '1'});  // waits for the SET
  later.join();
  b.wait({"k"});
  CHECK(a.add("n", 5) == 5);
  CHECK(b.add("n", -2) == 3);
  server.set("local", "x");
  CHECK(a.get("local") == std::vector<char>{'x'});
  CHECK_THAT(thrown([&] { b.wait({"k", "never"}, std::chrono::milliseconds(200)); }),
             Catch::Contains("keys not set after 200 ms: never"));
  // An idle connection is closed after idle_seconds; the client reconnects by itself.
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  CHECK(a.add("n", 1) == 4);
  CHECK(server.rejected() == 0);
}

TEST_CASE("the server refuses wrong proofs, bad MACs, replays, oversized and malformed "
          "requests") {
  RendezvousServer server(raw(), quick());
  RendezvousClient wrong("127.0.0.1", server.port(), std::string(16, 'w'), 5.0, 3);
  CHECK_THAT(thrown([&] { wrong.set("k", {'x'}); }),
             Catch::Contains("refused this rank's proof of the job secret") &&
                 Catch::Contains("TUTTI_SECRET"));
  {
    Peer p(server.port());
    p.prove(std::string(16, 'w'));
    expectRefusal(p, kRdzvUnauthenticated, "proof of the job secret (HMAC) does not match");
  }
  {
    Peer p(server.port());
    const std::string nonce = p.authenticate();
    p.send(request(raw(), nonce, kRdzvSet, 1, "a", "1"));
    CHECK(p.reply().first == kRdzvOk);
    p.send(request(raw(), nonce, kRdzvSet, 1, "a", "2"));  // seq 1 again: a replay
    expectRefusal(p, kRdzvUnauthenticated, "sequence 1, expected 2");
  }
  {
    Peer p(server.port());
    const std::string nonce = p.authenticate();
    p.send(request(std::string(16, 'w'), nonce, kRdzvSet, 1, "a", "3"));  // proved, then forged
    expectRefusal(p, kRdzvUnauthenticated, "HMAC does not match");
  }
  {
    Peer p(server.port());
    p.authenticate();
    p.send(header(kRdzvSet, 1, 0, 1, 1ull << 40));  // claims a 1 TiB value
    expectRefusal(p, kRdzvBadRequest, "request too large");
  }
  {
    Peer p(server.port());
    p.authenticate();
    p.send(header(9, 1, 0, 1, 1));  // op 9
    expectRefusal(p, kRdzvBadRequest, "malformed request");
  }
  CHECK(server.rejected() == 6);
  RendezvousClient good("127.0.0.1", server.port(), raw(), 5.0, 0);
  CHECK(good.get("a") == std::vector<char>{'1'});  // the refusals took nothing down
  CHECK(server.busy() == 0);
}

TEST_CASE("a connection has auth_seconds to prove the secret; the oldest waiting goes first") {
  {
    RendezvousServer server(raw(), quick());
    const auto start = std::chrono::steady_clock::now();
    Peer idle(server.port());  // says nothing after the hello
    idle.hello();
    Peer slow(server.port());  // half a proof
    slow.send(rendezvousProof(raw(), slow.hello()).substr(0, 20));
    CHECK(idle.closedWithin(3));
    CHECK(slow.closedWithin(1));
    CHECK((since(start) >= 0.4 && since(start) < 2.0));
    CHECK(waitFor([&] { return server.dropped(); }, 2));
    CHECK(server.rejected() == 0);
  }
  auto options = quick();
  options.auth_seconds = 30;
  options.max_pending = 3;
  RendezvousServer server(raw(), options);
  Peer p1(server.port()), p2(server.port()), p3(server.port());
  p1.hello();
  p2.hello();
  p3.hello();
  CHECK(waitFor([&] { return server.pending(); }, 3));
  Peer p4(server.port());  // a fourth waits: the oldest, p1, makes room
  const std::string nonce = p4.hello();
  CHECK(p1.closedWithin(2));
  CHECK_FALSE(p2.closedWithin(0.2));
  CHECK(server.dropped() == 1);
  p4.send(rendezvousProof(raw(), nonce));
  CHECK(p4.reply().first == kRdzvOk);
  CHECK(waitFor([&] { return server.connections(); }, 1));
}

TEST_CASE("a full server answers BUSY and the client retries until its deadline") {
  auto options = quick();
  options.idle_seconds = 30;
  options.max_connections = 2;
  RendezvousServer server(raw(), options);
  auto a = std::make_unique<RendezvousClient>("127.0.0.1", server.port(), raw(), 5.0, 0);
  RendezvousClient b("127.0.0.1", server.port(), raw(), 5.0, 1);
  a->set("k", {'1'});  // a and b hold both slots
  b.set("k", {'2'});
  {
    Peer p(server.port());
    p.prove(raw());
    expectRefusal(p, kRdzvBusy, "all 2 connection slots are taken");
  }
  RendezvousClient late("127.0.0.1", server.port(), raw(), 0.5, 2);
  CHECK_THAT(thrown([&] { late.get("k"); }),
             Catch::Contains("could not connect") && Catch::Contains("server busy"));
  const uint64_t busy_before = server.busy();
  CHECK(busy_before >= 2);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    a.reset();  // a slot comes back
  });
  const auto start = std::chrono::steady_clock::now();
  RendezvousClient patient("127.0.0.1", server.port(), raw(), 5.0, 2);
  CHECK(patient.get("k") == std::vector<char>{'2'});
  release.join();
  CHECK(since(start) >= 0.4);
  CHECK(server.busy() > busy_before);
  CHECK(server.rejected() == 0);
}

TEST_CASE("a request past the bytes in flight is answered BUSY and sent again") {
  auto options = quick();
  options.message_seconds = 1;
  options.max_inflight_bytes = 4096;
  RendezvousServer server(raw(), options);
  Peer big(server.port());  // a header claiming 1 MiB, then nothing: it holds the budget
  big.authenticate();
  big.send(header(kRdzvSet, 1, 0, 1, 1 << 20));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    Peer p(server.port());
    p.authenticate();
    p.send(header(kRdzvSet, 1, 0, 1, 100));
    expectRefusal(p, kRdzvBusy, "too many large requests in flight");
  }
  const auto start = std::chrono::steady_clock::now();
  RendezvousClient client("127.0.0.1", server.port(), raw(), 5.0, 0);
  client.set("k", std::vector<char>(100, 'v'));  // BUSY until `big` passes its 1 s deadline
  CHECK(since(start) >= 0.5);
  CHECK(big.closedWithin(1));
  CHECK(client.get("k").size() == 100);
  CHECK(server.busy() >= 2);
}

TEST_CASE("peers without the secret hold no memory or slots") {
  SECTION("headers claiming 64 MiB bodies are refused at once and reserve nothing") {
    auto options = quick();
    options.auth_seconds = 10;
    RendezvousServer server(raw(), options);
    std::vector<std::unique_ptr<Peer>> evil;
    for (int i = 0; i < 4; ++i) {
      evil.push_back(std::make_unique<Peer>(server.port()));
      evil.back()->hello();  // the first 36 bytes are taken as the proof
      evil.back()->send(header(kRdzvSet, 1, 0, 8, (64ull << 20) - 64) + "key/evil");
    }
    RendezvousClient client("127.0.0.1", server.port(), raw(), 5.0, 0);
    client.set("big", std::vector<char>(1 << 20, 'x'));  // needs the budget they asked for
    CHECK(client.get("big").size() == size_t(1) << 20);
    for (auto& p : evil) expectRefusal(*p, kRdzvUnauthenticated, "proof of the job secret");
    CHECK(server.rejected() == 4);
  }
  SECTION("thousands of idle connections do not keep ranks out") {
    rlimit limit{};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 2 * 4200 + 256);
    ::setrlimit(RLIMIT_NOFILE, &limit);
    const size_t count = std::min<size_t>(4200, (limit.rlim_cur - 256) / 2);
    REQUIRE(count > 1100);  // past max_pending (1024): the oldest are evicted
    RendezvousServer server(raw(), RendezvousServerOptions{});  // the defaults: 2 s, 1024
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::unique_ptr<Peer>> idle;
    for (size_t i = 0; i < count; ++i) {
      idle.push_back(std::make_unique<Peer>(server.port()));
      idle.back()->hello();
    }
    std::vector<std::string> errors(3);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 3; ++r)
      ranks.emplace_back([&, r] {
        errors[r] = thrown([&] {
          RendezvousClient c("127.0.0.1", server.port(), raw(), 20.0, r);
          c.set("rank/" + std::to_string(r), {char('0' + r)});
          for (int other = 0; other < 3; ++other)
            if (c.get("rank/" + std::to_string(other)) != std::vector<char>{char('0' + other)})
              throw std::runtime_error("rank " + std::to_string(other) + ": wrong value");
        });
      });
    for (auto& t : ranks) t.join();
    for (const auto& e : errors) CHECK(e == "(nothing thrown)");
    CHECK(since(start) < 15);
    CHECK(waitFor([&] { return server.dropped(); }, count, 10));  // each closed, none served
    CHECK(idle.front()->closedWithin(1));
    CHECK(server.pending() == 0);
  }
}

// tuttirun's Python client (launcher/tuttirun_lib/rendezvous.py) against this server.
TEST_CASE("the Python client speaks the same protocol") {
  const char* python = "/usr/bin/python3";
  if (::access(python, X_OK) != 0) {
    WARN("no /usr/bin/python3: the Python client is not tried");
    return;
  }
  RendezvousServer server(raw(), quick());
  server.set("cpp", "from c++");
  char path[] = "/tmp/tutti-slurm-unit-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  const std::string script = R"(import sys
sys.path.insert(0, sys.argv[1])
from tuttirun_lib import rendezvous as rv
port, secret = int(sys.argv[2]), bytes.fromhex(sys.argv[3])
c = rv.RendezvousClient("127.0.0.1", port, secret, timeout=5)
c.set(b"py", b"from python")
assert c.get(b"cpp", 5000) == b"from c++"
assert c.add(b"n", 7) == 7
c.wait([b"py", b"cpp"], 1000)
try:
    rv.RendezvousClient("127.0.0.1", port, b"w" * 16, timeout=5)
    sys.exit("a wrong secret was accepted")
except rv.RendezvousError as e:
    assert e.status == rv.UNAUTHENTICATED, e
print("python client ok")
)";
  REQUIRE(::write(fd, script.data(), script.size()) == ssize_t(script.size()));
  ::close(fd);
  const std::string command = std::string("timeout 30 ") + python + " " + path + " " +
                              TUTTI_SOURCE_DIR "/launcher " + std::to_string(server.port()) +
                              " " + kSecret + " 2>&1";
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe);
  char buf[512];
  while (::fgets(buf, sizeof(buf), pipe)) output += buf;
  const int status = ::pclose(pipe);
  ::unlink(path);
  INFO(output);
  CHECK(status == 0);
  CHECK_THAT(output, Catch::Contains("python client ok"));
  RendezvousClient client("127.0.0.1", server.port(), raw(), 5.0, 0);
  CHECK(client.get("py") == std::vector<char>{'f', 'r', 'o', 'm', ' ', 'p', 'y', 't', 'h',
                                              'o', 'n'});
  CHECK(client.add("n", 0) == 7);
  CHECK(server.rejected() == 1);  // the wrong secret's proof
}

TEST_CASE("the server refuses a short secret and a port in use") {
  CHECK_THAT(thrown([] { RendezvousServer("short", quick()); }),
             Catch::Contains("at least 16 bytes"));
  RendezvousServer first(raw(), quick());
  auto options = quick();
  options.port = first.port();
  // SO_REUSEADDR does not let a second listener take a port that one listens on.
  CHECK_THAT(thrown([&] { RendezvousServer second(raw(), options); }),
             Catch::Contains("cannot listen on 127.0.0.1:" + std::to_string(first.port())));
}
