#include "backends/gloo/slurm_rendezvous.h"

#include "base/common.h"
#include "base/logging.h"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tutti {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void badList(const std::string& what, const std::string& list,
                          const std::string& why) {
  throwError(StatusCode::kInvalidArgument,
             what + "='" + list + "': expected a Slurm host list such as 'n[1-3,5],m7' (" +
                 why + ")");
}

uint64_t parseId(const std::string& name, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(value.c_str(), &end, 10);
  if (value.empty() || errno != 0 || *end != '\0' || value[0] == '-')
    throwError(StatusCode::kInvalidArgument,
               name + "='" + value + "': expected a number (to derive the gloo rendezvous "
                                     "port; set TUTTI_RENDEZVOUS_PORT instead)");
  return v;
}

// Appends the names `prefix` + each of `ranges` + the expansion of `rest`.
void expandEntry(const std::string& prefix, const std::string& rest, const std::string& list,
                 const std::string& what, size_t max_hosts, std::vector<std::string>& out) {
  const size_t open = rest.find('[');
  if (open == std::string::npos) {
    if (rest.find(']') != std::string::npos) badList(what, list, "a ']' without '['");
    if (out.size() >= max_hosts)
      badList(what, list, "more than " + std::to_string(max_hosts) + " hosts");
    out.push_back(prefix + rest);
    return;
  }
  const size_t close = rest.find(']', open);
  if (close == std::string::npos) badList(what, list, "a '[' without ']'");
  const std::string head = prefix + rest.substr(0, open);
  const std::string tail = rest.substr(close + 1);
  const std::string body = rest.substr(open + 1, close - open - 1);
  if (body.empty()) badList(what, list, "empty brackets");
  for (size_t pos = 0; pos <= body.size();) {
    size_t comma = body.find(',', pos);
    if (comma == std::string::npos) comma = body.size();
    const std::string range = body.substr(pos, comma - pos);
    const size_t dash = range.find('-');
    const std::string lo = range.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!digits(lo) || !digits(hi)) badList(what, list, "range '" + range + "' is not a-b");
    const long first = std::stol(lo), last = std::stol(hi);
    if (last < first) badList(what, list, "range '" + range + "' runs backwards");
    for (long n = first; n <= last; ++n) {
      std::string number = std::to_string(n);
      if (number.size() < lo.size()) number.insert(0, lo.size() - number.size(), '0');
      expandEntry(head + number, tail, list, what, max_hosts, out);
    }
    pos = comma + 1;
  }
}

std::string readSecretFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::string();
  if (!S_ISREG(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 077) != 0)
    throwError(StatusCode::kInvalidArgument,
               "gloo under srun: " + path + " must be a regular file of this user (uid " +
                   std::to_string(::getuid()) + ") that no one else can read, got owner uid " +
                   std::to_string(st.st_uid) + " and mode 0" +
                   std::to_string((st.st_mode >> 6 & 7) * 100 + (st.st_mode >> 3 & 7) * 10 +
                                  (st.st_mode & 7)) +
                   ": chmod 600 " + path);
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return decodeHexSecret(line);
}

// Makes `home`/.tutti/secret: 32 random bytes as hex, written to a file of mode 0600 under
// another name and linked into place, so that no rank reads half a key and a key another
// process made first is kept.
void makeSecretFile(const std::string& home, const std::string& who) {
  const std::string dir = home + "/.tutti", path = dir + "/secret";
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throwError(StatusCode::kInvalidArgument,
               who + ": cannot make " + dir + " for the job's secret: " + std::strerror(errno) +
                   " (export TUTTI_SECRET=$(openssl rand -hex 32) instead)");
  unsigned char raw[32];
  std::ifstream random("/dev/urandom", std::ios::binary);
  if (!random.read(reinterpret_cast<char*>(raw), sizeof raw))
    throwError(StatusCode::kInternal, who + ": cannot read /dev/urandom for the job's secret");
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : raw) {
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  hex += "\n";
  const std::string tmp = path + ".new." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    throwError(StatusCode::kInvalidArgument,
               who + ": cannot write " + tmp + ": " + std::strerror(errno) +
                   " (export TUTTI_SECRET=$(openssl rand -hex 32) instead)");
  const bool written = ::write(fd, hex.data(), hex.size()) == static_cast<ssize_t>(hex.size());
  ::close(fd);
  const bool linked = written && (::link(tmp.c_str(), path.c_str()) == 0 || errno == EEXIST);
  ::unlink(tmp.c_str());
  if (!linked)
    throwError(StatusCode::kInvalidArgument,
               who + ": cannot make " + path + ": " + std::strerror(errno) +
                   " (export TUTTI_SECRET=$(openssl rand -hex 32) instead)");
  if (logEnabled(LogLevel::kInfo))
    logLine(LogLevel::kInfo,
            who + ": made the job secret " + path + " (mode 0600; docs/env_vars.md)");
}

}  // namespace

std::vector<std::string> expandHostlist(const std::string& list, const std::string& what,
                                        size_t max_hosts) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char ch = i < list.size() ? list[i] : ',';
    if (ch == '[') ++depth;
    if (ch == ']') --depth;
    if (depth < 0 || depth > 1) badList(what, list, "unbalanced or nested brackets");
    if (ch == ',' && depth == 0) {
      const std::string entry = list.substr(start, i - start);
      if (entry.empty()) badList(what, list, "an empty name");
      expandEntry("", entry, list, what, max_hosts, out);
      start = i + 1;
    }
  }
  if (depth != 0) badList(what, list, "a '[' without ']'");
  return out;
}

int slurmRendezvousPort(const std::string& job_id, const std::string& step_id) {
  const uint64_t job = parseId("SLURM_JOB_ID", job_id) % 750;
  const uint64_t step = parseId("SLURM_STEP_ID", step_id) % 16;
  return static_cast<int>(20000 + job * 16 + step);
}

std::string jobSecret(const std::string& hex, const std::string& home, const std::string& who,
                      const std::string& before, bool make, bool first,
                      Clock::time_point deadline) {
  std::string secret;
  std::string from = "TUTTI_SECRET";
  if (!hex.empty()) {
    secret = decodeHexSecret(hex);
  } else if (!home.empty()) {
    from = home + "/.tutti/secret";
    secret = readSecretFile(from);
    if (secret.empty() && make && first) makeSecretFile(home, who);
    // The others wait for rank 0's file (it may start later than they do).
    while (secret.empty() && make && Clock::now() < deadline) {
      secret = readSecretFile(from);
      if (secret.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  if (secret.empty())
    throwError(StatusCode::kInvalidArgument,
               who + ": no job secret for the rendezvous server rank 0 hosts (an "
               "unauthenticated one would let anyone who reaches its port into the job). "
               "Either export TUTTI_SECRET=$(openssl rand -hex 32) before " + before +
                   ", or make a key file once, on a home directory every node shares: mkdir -p "
                   "~/.tutti && (umask 077 && openssl rand -hex 32 > ~/.tutti/secret)");
  if (secret.size() < 16)
    throwError(StatusCode::kInvalidArgument,
               who + ": the secret from " + from + " has " + std::to_string(secret.size()) +
                   " bytes; it needs at least 16 (32 hex digits: openssl rand -hex 32)");
  return secret;
}

std::string slurmSecret(const BackendOptions& options) {
  return jobSecret(options.secret, options.slurm.home, "gloo under srun",
                   "srun or sbatch (srun passes the environment to every task)", false, false,
                   Clock::now());
}

namespace {

// Steps 1-3 of the header's protocol for `spec`; `who` begins every message.
ServedRendezvous serve(const HostedRendezvous& spec, const std::string& secret,
                       const BackendOptions& options, int generation, Clock::time_point deadline) {
  const int rank = options.rank;
  const std::string me = "gloo under " + spec.launcher + ": rank " + std::to_string(rank);
  const std::string where = spec.host_from + ", port from " + spec.port_from;
  const std::string key = "tutti/hosted/t" + std::to_string(generation);
  ServedRendezvous r;
  r.host = spec.host;
  r.port = spec.port;
  if (rank == 0) {
    RendezvousServerOptions server_options;
    server_options.port = r.port;
    server_options.message_seconds = std::max(1.0, options.start_timeout_seconds);
    try {
      r.server = std::make_unique<RendezvousServer>(secret, server_options);
    } catch (const Error& e) {
      throwError(e.code(), me + ": " + e.what() + " (" + where +
                               "; another program on this host may hold the port: set "
                               "TUTTI_RENDEZVOUS_PORT to a free one)");
    }
    r.server->set(key, spec.identity);
  }
  // Ask until the deadline: rank 0 may not listen yet, or an earlier server of this job
  // (the previous init) may still be going away.
  std::string last = "no attempt";
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) break;
    std::string value;
    std::unique_ptr<RendezvousClient> client;
    try {
      client = std::make_unique<RendezvousClient>(r.host, r.port, secret, left, rank);
      client->wait({key}, std::chrono::milliseconds(
                              std::max<int64_t>(1, std::min<int64_t>(1000, left * 1000))));
      const std::vector<char> got = client->get(key);
      value.assign(got.begin(), got.end());
    } catch (const Error& e) {
      last = e.what();
      if (last.find("HMAC") != std::string::npos ||
          last.find("failed authentication") != std::string::npos)
        throwError(StatusCode::kBackend,
                   me + ": the server at " + r.host + ":" + std::to_string(r.port) + " (" +
                       where + ") does not share this job's secret: is another job using the "
                       "port, or do the ranks see different secrets? (" + last + ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (value != spec.identity)
      throwError(StatusCode::kBackend,
                 me + ": the rendezvous server at " + client->endpoint() + " belongs to " +
                     value + ", not to this " + spec.identity + " (" + where +
                     "): set TUTTI_RENDEZVOUS_PORT to a free port");
    r.client = std::move(client);
    return r;
  }
  throwError(StatusCode::kTimeout,
             me + " could not reach rank 0's rendezvous server at " + r.host + ":" +
                 std::to_string(r.port) + " (" + where + ") within " +
                 secondsText(options.start_timeout_seconds) +
                 " s (TUTTI_START_TIMEOUT_SECONDS). Did rank 0 fail first (see its error), or "
                 "does it run without gloo (TUTTI_CPU_OPERATIONS must be the same for every "
                 "rank)? Last error: " + last);
}

Clock::time_point startDeadline(const BackendOptions& options) {
  return Clock::now() + std::chrono::milliseconds(
                            static_cast<int64_t>(options.start_timeout_seconds * 1000.0));
}

}  // namespace

ServedRendezvous connectSlurmRendezvous(const BackendOptions& options, int generation) {
  const SlurmStep& step = options.slurm;
  HostedRendezvous spec;
  spec.launcher = "srun";
  if (!options.rendezvous_addr.empty()) {
    spec.host = options.rendezvous_addr;
    spec.host_from = "TUTTI_RENDEZVOUS_ADDR";
  } else {
    spec.host = expandHostlist(step.node_list, "SLURM_STEP_NODELIST").front();
    spec.host_from = "the first node of SLURM_STEP_NODELIST '" + step.node_list + "'";
  }
  spec.port = options.rendezvous_port > 0 ? options.rendezvous_port
                                          : slurmRendezvousPort(step.job_id, step.step_id);
  spec.port_from = options.rendezvous_port > 0
                       ? "TUTTI_RENDEZVOUS_PORT"
                       : "SLURM_JOB_ID " + step.job_id + " and SLURM_STEP_ID " + step.step_id;
  spec.identity = "Slurm step " + step.job_id + "." + step.step_id;
  const std::string secret = slurmSecret(options);
  if (options.rank == 0 && options.rendezvous_addr.empty() && step.node_id > 0)
    throwError(StatusCode::kInvalidArgument,
               "gloo under srun: rank 0 runs on node " + step.node_name + " (SLURM_NODEID " +
                   std::to_string(step.node_id) + "), but the other ranks look for its "
                   "rendezvous server on " + spec.host + ", " + spec.host_from +
                   ". Use srun's block or cyclic distribution, or set "
                   "TUTTI_RENDEZVOUS_ADDR to task 0's host");
  return serve(spec, secret, options, generation, startDeadline(options));
}

ServedRendezvous connectHostedRendezvous(const BackendOptions& options, int generation) {
  HostedRendezvous spec = options.hosted;
  if (!options.rendezvous_addr.empty()) {
    spec.host = options.rendezvous_addr;
    spec.host_from = "TUTTI_RENDEZVOUS_ADDR";
  }
  if (options.rendezvous_port > 0) {
    spec.port = options.rendezvous_port;
    spec.port_from = "TUTTI_RENDEZVOUS_PORT";
  }
  if (spec.host.empty() || spec.port <= 0)
    throwError(StatusCode::kInvalidArgument,
               spec.missing.empty() ? "gloo under " + spec.launcher +
                                          ": no address for rank 0's rendezvous server (set "
                                          "TUTTI_RENDEZVOUS_ADDR and TUTTI_RENDEZVOUS_PORT)"
                                    : spec.missing);
  const auto deadline = startDeadline(options);
  const std::string who = "gloo under " + spec.launcher + ": rank " + std::to_string(options.rank);
  const std::string secret =
      jobSecret(options.secret, spec.home, who, spec.launcher + " (every rank must see it)",
                spec.one_host, options.rank == 0, deadline);
  return serve(spec, secret, options, generation, deadline);
}

}  // namespace detail
}  // namespace tutti
