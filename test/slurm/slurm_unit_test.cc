// The pieces of gloo under srun that need no Slurm: the host list parser, the port, the
// secret, and the in-process rendezvous server against the real client and raw sockets
// (bad MAC, replay, oversized, malformed, idle, busy, too many connections).
#include "backends/gloo/rendezvous_client.h"
#include "backends/gloo/rendezvous_server.h"
#include "backends/gloo/rendezvous_wire.h"
#include "backends/gloo/slurm_rendezvous.h"
#include "core/common.h"
#include "test/catch.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
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
  std::string hello() { return read(kRendezvousHelloBytes).substr(5); }
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
  std::string frame = header(op, seq, 0, key.size(), value.size()) + key + value;
  return frame + hmacSha256(secret, "tutti-rdzv-req" + nonce + frame);
}

// The next reply is a refusal with `status` and a message containing `text`; then the
// server closes the connection.
void expectRefusal(Peer& p, int status, const std::string& text) {
  auto r = p.reply();
  CHECK(r.first == status);
  CHECK_THAT(r.second, Catch::Contains(text));
  CHECK(p.closedWithin(2));
}

// Waits (at most 2 s) until the server holds `n` connections.
bool waitForConnections(const RendezvousServer& server, size_t n) {
  for (int i = 0; i < 100 && server.connections() != n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return server.connections() == n;
}

RendezvousServerOptions quick() {
  RendezvousServerOptions o;
  o.bind_host = "127.0.0.1";
  o.preauth_seconds = 0.5;
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
  Config config;
  config.secret = kSecret;
  CHECK(slurmSecret(config) == raw());
  config.secret = "abcd";
  CHECK_THAT(thrown([&] { slurmSecret(config); }), Catch::Contains("at least 16"));

  char dir[] = "/tmp/tutti-slurm-unit-XXXXXX";
  REQUIRE(::mkdtemp(dir));
  config.secret.clear();
  config.slurm.home = dir;
  CHECK_THAT(thrown([&] { slurmSecret(config); }),
             Catch::Contains("no job secret") && Catch::Contains("openssl rand -hex 32"));
  const std::string sub = std::string(dir) + "/.tutti", file = sub + "/secret";
  ::mkdir(sub.c_str(), 0700);
  std::ofstream(file) << kSecret << "\n";
  ::chmod(file.c_str(), 0644);
  CHECK_THAT(thrown([&] { slurmSecret(config); }),
             Catch::Contains("mode 0644") && Catch::Contains("chmod 600 " + file));
  ::chmod(file.c_str(), 0600);
  CHECK(slurmSecret(config) == raw());
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

TEST_CASE("the server refuses bad MACs, replays, oversized and malformed requests") {
  RendezvousServer server(raw(), quick());
  RendezvousClient wrong("127.0.0.1", server.port(), std::string(16, 'w'), 5.0, 3);
  CHECK_THAT(thrown([&] { wrong.set("k", {'x'}); }),
             Catch::Contains("rejected the request's HMAC") && Catch::Contains("job secret"));
  {
    Peer p(server.port());
    const std::string nonce = p.hello();
    p.send(request(raw(), nonce, kRdzvSet, 1, "a", "1"));
    CHECK(p.reply().first == kRdzvOk);
    p.send(request(raw(), nonce, kRdzvSet, 1, "a", "2"));  // seq 1 again: a replay
    expectRefusal(p, kRdzvUnauthenticated, "sequence 1, expected 2");
  }
  {
    Peer p(server.port());
    p.hello();
    p.send(header(kRdzvSet, 1, 0, 1, 1ull << 40));  // claims a 1 TiB value
    expectRefusal(p, kRdzvBadRequest, "request too large");
  }
  {
    Peer p(server.port());
    p.hello();
    p.send(header(9, 1, 0, 1, 1));  // op 9
    expectRefusal(p, kRdzvBadRequest, "malformed request");
  }
  CHECK(server.rejected() == 4);
  RendezvousClient good("127.0.0.1", server.port(), raw(), 5.0, 0);
  CHECK(good.get("a") == std::vector<char>{'1'});  // the refusals took nothing down
}

TEST_CASE("unauthenticated peers hold no slot or memory for long") {
  auto options = quick();
  options.max_preauth_bytes = 4096;
  options.max_connections = 3;
  RendezvousServer server(raw(), options);
  const auto start = std::chrono::steady_clock::now();
  {
    Peer idle(server.port());  // says nothing after the hello
    idle.hello();
    CHECK(idle.closedWithin(3));
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                            .count();
    CHECK((took >= 0.4 && took < 2.0));
  }
  {
    Peer slow(server.port());  // a header claiming 1 MiB, then body bytes past the budget
    slow.hello();
    slow.send(header(kRdzvSet, 1, 0, 1, 1 << 20) + std::string(8192, 'x'));
    expectRefusal(slow, kRdzvBadRequest, "server busy");
  }
  {
    Peer p1(server.port()), p2(server.port()), p3(server.port());
    p1.hello();
    p2.hello();
    p3.hello();
    CHECK(waitForConnections(server, 3));
    Peer p4(server.port());  // past max_connections: closed at once
    CHECK(p4.closedWithin(2));
  }
  CHECK(waitForConnections(server, 0));  // every slot comes back once the peers are gone
  RendezvousClient good("127.0.0.1", server.port(), raw(), 5.0, 0);
  good.set("k", {'1'});
  CHECK(good.get("k") == std::vector<char>{'1'});
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
