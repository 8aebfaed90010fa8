// Failure behaviour of the gloo transport under `tuttirun -np 3`, one mode per run:
//  timeout   rank 0 skips an allreduce: the others fail with kTimeout (or, once a peer has
//            poisoned and closed the group, kBackend) near their 3 s deadline, and every
//            later call fails fast, on the control plane too (the transport is poisoned);
//            rank 0's next calls fail too instead of hanging.
//  dead-peer rank 2 exits; ranks 0 and 1 fail long before their 60 s deadline.
//  abort     rank 0 aborts: its next call fails at once with kAborted naming the reason;
//            the others fail fast.
//  abort-blocked  ranks 1 and 2 block on an allreduce rank 0 skips; another thread's
//            abort() wakes them long before their deadline.
//  size-mismatch  rank 1 allreduces 1000 floats, the others 1001 (over TCP pairs, as with
//            TUTTI_SHM=0): gloo must never pair messages of different sizes (a larger send
//            is an uncaught EnforceNotMet on gloo's device thread, std::terminate; a smaller
//            one a silent short receive): every rank gets a Tutti error naming the op
//            within its 3 s deadline (plus a peer's close), and stays alive.
//  abort-mid-transfer  rank 1 aborts while rank 0 broadcasts 256 MB to ranks 1 and 2, so
//            that rank 0's send to rank 1 is in flight when rank 1 resets the connection
//            (gloo itself never wakes such a send): rank 0 fails within seconds naming world
//            rank 1, not at its 30 s deadline.
//  auth      a rendezvous client with a wrong secret is refused; the right one works (SET,
//            GET, WAIT, ADD across ranks).
#include "backends/gloo/gloo_transport.h"
#include "backends/gloo/rendezvous_client.h"
#include "test/gloo/gloo_test_util.h"

#include <numeric>
#include <thread>

#include <unistd.h>

using namespace tutti;
using namespace tutti::test;

namespace {

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Runs fn, expecting an Error; returns {code, message, seconds taken}.
template <typename F>
bool expectError(Checker& c, const std::string& what, F fn, StatusCode* code,
                 std::string* message, double* seconds) {
  auto start = Clock::now();
  try {
    fn();
  } catch (const Error& e) {
    *code = e.code();
    *message = e.what();
    *seconds = since(start);
    std::printf("%s: %.2f s: %s\n", what.c_str(), *seconds, e.what());
    return true;
  }
  c.check(false, what + ": expected an error, the call succeeded");
  return false;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  BackendOptions options = optionsFromEnv();
  const int rank = options.rank, size = options.size;
  Checker c(rank);
  std::vector<float> data(1001, 1.0f);
  StatusCode code = StatusCode::kOk;
  std::string message;
  double seconds = 0;
  try {
    if (mode == "auth") {
      const std::string secret = detail::decodeHexSecret(options.secret);
      std::string wrong = secret;
      wrong[0] = static_cast<char>(wrong[0] ^ 1);
      detail::RendezvousClient bad(options.rendezvous_addr, options.rendezvous_port, wrong, 5.0,
                                   rank);
      if (expectError(c, "wrong secret SET", [&] { bad.set("auth/evil", {'x'}); }, &code,
                      &message, &seconds))
        c.check(code == StatusCode::kBackend && contains(message, "HMAC"),
                "wrong secret is refused as unauthenticated");
      detail::RendezvousClient good(options.rendezvous_addr, options.rendezvous_port, secret,
                                    options.timeout_seconds, rank);
      good.set("auth/" + std::to_string(rank), {static_cast<char>('A' + rank)});
      good.add("auth/counter", rank + 1);
      for (int r = 0; r < size; ++r) {
        auto value = good.get("auth/" + std::to_string(r));
        c.check(value.size() == 1 && value[0] == 'A' + r, "GET of rank " + std::to_string(r));
      }
      good.wait({"auth/0", "auth/" + std::to_string(size - 1)});
      int64_t sum = 0, expect = static_cast<int64_t>(size) * (size + 1) / 2;
      for (auto start = Clock::now(); since(start) < 20 && sum != expect;) {
        sum = good.add("auth/counter", 0);
        if (sum != expect) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      c.check(sum == expect, "ADD counter sums every rank's delta");
      detail::RendezvousClient quick(options.rendezvous_addr, options.rendezvous_port, secret,
                                     1.0, rank);
      if (expectError(c, "GET of a missing key", [&] { quick.get("auth/never"); }, &code,
                      &message, &seconds))
        c.check(code == StatusCode::kTimeout && contains(message, "auth/never") &&
                    seconds < 10, "GET of a missing key times out naming the key");
      return c.finish("gloo rendezvous auth");
    }

    auto transport = makeGlooTransport(options);
    std::vector<int> world(size);
    std::iota(world.begin(), world.end(), 0);
    auto cp = transport->makeControlPlane(world, 0);
    auto be = transport->makeBackend(world, 0);
    be->barrier(deadlineAfter(30));

    if (mode == "timeout") {
      if (rank == 0) {
        std::this_thread::sleep_for(std::chrono::seconds(6));
        if (expectError(c, "rank 0 barrier after peers timed out",
                        [&] { be->barrier(deadlineAfter(20)); }, &code, &message, &seconds))
          c.check(seconds < 15, "rank 0 fails fast once its peers gave up");
        if (expectError(c, "rank 0 control gather after peers timed out",
                        [&] { cp->gather("x", deadlineAfter(20)); }, &code, &message, &seconds))
          c.check(seconds < 15, "rank 0's control plane fails fast too");
      } else {
        if (expectError(c, "allreduce with a missing rank", [&] {
              be->allreduce(data.data(), data.data(), 1001, DataType::kFloat32,
                            ReduceOp::kSum, deadlineAfter(3));
            }, &code, &message, &seconds)) {
          c.check(code == StatusCode::kTimeout || code == StatusCode::kBackend,
                  "timeout code");
          c.check(seconds < 13, "timeout near the 3 s deadline");
          c.check(contains(message, "allreduce") && contains(message, "process set 0"),
                  "message names the op and the process set: " + message);
        }
        if (expectError(c, "allreduce after the timeout", [&] {
              be->allreduce(data.data(), data.data(), 1, DataType::kFloat32, ReduceOp::kSum,
                            deadlineAfter(30));
            }, &code, &message, &seconds))
          c.check(seconds < 0.5 && contains(message, "poisoned"),
                  "a poisoned group fails fast");
        const StatusCode first = code;
        if (expectError(c, "control broadcast after the data plane timed out",
                        [&] { cp->broadcast("x", deadlineAfter(30)); }, &code, &message,
                        &seconds))
          c.check(seconds < 0.5 && code == first && contains(message, "failed first"),
                  "the timeout poisons the whole transport, control plane included");
      }
    } else if (mode == "dead-peer") {
      if (rank == 2) {
        std::fflush(stdout);
        _exit(0);
      }
      if (expectError(c, "allreduce with a dead peer", [&] {
            be->allreduce(data.data(), data.data(), 1001, DataType::kFloat32, ReduceOp::kSum,
                          deadlineAfter(60));
          }, &code, &message, &seconds))
        c.check(seconds < 20, "a dead peer is noticed long before the deadline");
    } else if (mode == "abort") {
      if (rank == 0) {
        be->abort("test abort");
        if (expectError(c, "allreduce after abort", [&] {
              be->allreduce(data.data(), data.data(), 3, DataType::kFloat32, ReduceOp::kSum,
                            deadlineAfter(30));
            }, &code, &message, &seconds))
          c.check(code == StatusCode::kAborted && contains(message, "test abort") &&
                      seconds < 0.5, "abort poisons at once and names the reason");
      } else {
        if (expectError(c, "allreduce after a peer aborted", [&] {
              be->allreduce(data.data(), data.data(), 1001, DataType::kFloat32,
                            ReduceOp::kSum, deadlineAfter(30));
            }, &code, &message, &seconds))
          c.check(seconds < 20, "peers of an aborted rank fail fast");
      }
    } else if (mode == "abort-blocked") {
      // abort() from another thread wakes an operation blocked on a missing peer.
      if (rank == 0) {
        std::this_thread::sleep_for(std::chrono::seconds(4));
      } else {
        std::thread aborter([&] {
          std::this_thread::sleep_for(std::chrono::seconds(1));
          be->abort("aborted from another thread");
        });
        if (expectError(c, "blocked allreduce, then abort", [&] {
              be->allreduce(data.data(), data.data(), 1001, DataType::kFloat32,
                            ReduceOp::kSum, deadlineAfter(30));
            }, &code, &message, &seconds))
          c.check(seconds < 10, "abort wakes a blocked operation");
        aborter.join();
      }
    } else if (mode == "abort-mid-transfer") {
      std::vector<char> big(size_t(256) << 20, rank == 0 ? 1 : 0);
      be->barrier(deadlineAfter(30));
      std::thread aborter;
      if (rank == 1)
        aborter = std::thread([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
          be->abort("aborted mid-transfer");
        });
      if (rank == 2) {  // may finish or fail (rank 0 closes its pairs when it fails)
        try {
          be->broadcast(big.data(), static_cast<int64_t>(big.size()), DataType::kUInt8, 0,
                        deadlineAfter(30));
        } catch (const Error& e) {
          std::printf("rank 2: broadcast: %s\n", e.what());
        }
      } else if (expectError(c, "broadcast of 256 MB, rank 1 aborting", [&] {
                   be->broadcast(big.data(), static_cast<int64_t>(big.size()),
                                 DataType::kUInt8, 0, deadlineAfter(30));
                 }, &code, &message, &seconds)) {
        c.check(seconds < 10, "the broadcast fails within seconds, not at its deadline");
        if (rank == 0)
          c.check(code == StatusCode::kBackend && contains(message, "world rank 1"),
                  "rank 0's error names world rank 1: " + message);
      }
      if (aborter.joinable()) aborter.join();
    } else if (mode == "size-mismatch") {
      const int64_t count = rank == 1 ? 1000 : 1001;
      if (expectError(c, "allreduce of " + std::to_string(count) + " floats", [&] {
            be->allreduce(data.data(), data.data(), count, DataType::kFloat32, ReduceOp::kSum,
                          deadlineAfter(3));
          }, &code, &message, &seconds)) {
        c.check(code == StatusCode::kTimeout || code == StatusCode::kBackend,
                "a size disagreement is a timeout or a backend error: " + message);
        c.check(seconds < 13, "it fails near the 3 s deadline");
        c.check(contains(message, "allreduce of " + std::to_string(count) + " x float32") &&
                    contains(message, "world rank"),
                "the message names the op, its size and a peer: " + message);
      }
    } else {
      std::fprintf(stderr, "usage: gloo_failure_test timeout|dead-peer|abort|abort-blocked|"
                           "size-mismatch|abort-mid-transfer|auth\n");
      return 2;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: unexpected error: %s\n", rank, e.what());
    return 2;
  }
  return c.finish(("gloo failure " + mode).c_str());
}
