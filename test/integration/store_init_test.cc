// tutti_init_with_store (docs/c_api.md, "Init from a store"): jobs of 1, 2 and 3 processes
// forked here, started from a key-value store in a temporary directory (one file per key, the
// way torch's FileStore shares one), with no launcher; collectives, re-init through the same
// store, a rank that never comes (a timeout naming the key), and bad arguments. Through tutti.h
// only. Every child has a deadline; the parent kills what outlives it.
#include <tutti/tutti.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

#define CHECK(cond)                                                                    \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed; last error: %s\n", g_rank, \
                   __FILE__, __LINE__, #cond, tutti_last_error());                     \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

int g_rank = -1;

// The store: one file per key under a directory, written whole and renamed into place.
struct FileStore {
  std::string dir;
  int sets = 0, gets = 0;
};

std::string pathOf(const FileStore& fs, const char* key) {
  std::string name;
  for (const char* c = key; *c; ++c) {
    if (std::isalnum(static_cast<unsigned char>(*c)) || *c == '.' || *c == '-' || *c == '_') {
      name += *c;
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", static_cast<unsigned char>(*c));
      name += hex;
    }
  }
  return fs.dir + "/" + name;
}

int storeSet(const char* key, const void* value, size_t nbytes, void* user) {
  auto* fs = static_cast<FileStore*>(user);
  ++fs->sets;
  const std::string path = pathOf(*fs, key);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(static_cast<const char*>(value), static_cast<std::streamsize>(nbytes));
    if (!out) return 2;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0 ? 0 : 3;
}

int storeGet(const char* key, double timeout_seconds, void** value, size_t* nbytes, void* user) {
  auto* fs = static_cast<FileStore*>(user);
  ++fs->gets;
  const std::string path = pathOf(*fs, key);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(timeout_seconds * 1e6));
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::stringstream bytes;
      bytes << in.rdbuf();
      const std::string s = bytes.str();
      *nbytes = s.size();
      *value = std::malloc(s.size() ? s.size() : 1);
      if (*value == nullptr) return 4;
      std::memcpy(*value, s.data(), s.size());
      return 0;
    }
    if (std::chrono::steady_clock::now() >= deadline) return 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

tutti_store_t storeOf(FileStore* fs) {
  tutti_store_t s;
  std::memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  s.set = storeSet;
  s.get = storeGet;
  s.user_data = fs;
  s.description = "test FileStore";
  return s;
}

void waitOk(tutti_handle_t h) { CHECK(tutti_wait(h, 60.0) == TUTTI_OK); }

// Allreduce, allgather (uneven rows) and broadcast on the global set.
void collectives(int rank, int size, int round) {
  std::vector<float> in(5), out(5);
  for (int i = 0; i < 5; ++i) in[i] = static_cast<float>(rank * 10 + i + round);
  tutti_handle_t h = 0;
  const std::string name = "sum." + std::to_string(round);
  CHECK(tutti_allreduce_async(name.c_str(), in.data(), out.data(), 5, TUTTI_FLOAT32, TUTTI_SUM,
                              1.0, 1.0, &h) == TUTTI_OK);
  waitOk(h);
  for (int i = 0; i < 5; ++i) {
    float want = 0;
    for (int r = 0; r < size; ++r) want += static_cast<float>(r * 10 + i + round);
    CHECK(out[i] == want);
  }

  std::vector<int32_t> rows(static_cast<size_t>(rank + 1), rank);  // rank r sends r+1 rows
  tutti_tensor_t t;
  std::memset(&t, 0, sizeof t);
  t.data = rows.data();
  t.dtype = TUTTI_INT32;
  t.ndim = 1;
  t.shape[0] = rank + 1;
  const std::string gname = "gather." + std::to_string(round);
  CHECK(tutti_allgather_async(gname.c_str(), &t, nullptr, &h) == TUTTI_OK);
  tutti_result_t result;
  std::memset(&result, 0, sizeof result);
  result.struct_size = sizeof result;
  CHECK(tutti_wait_result(h, 60.0, &result) == TUTTI_OK);
  CHECK(result.ndim == 1 && result.shape[0] == size * (size + 1) / 2);
  const auto* got = static_cast<const int32_t*>(result.data);
  int at = 0;
  for (int r = 0; r < size; ++r)
    for (int k = 0; k <= r; ++k) CHECK(got[at++] == r);
  tutti_free(result.data);

  std::vector<double> b(3, rank == size - 1 ? 2.5 + round : -1.0);
  const std::string bname = "bcast." + std::to_string(round);
  CHECK(tutti_broadcast_async(bname.c_str(), b.data(), 3, TUTTI_FLOAT64, size - 1, &h) ==
        TUTTI_OK);
  waitOk(h);
  for (double v : b) CHECK(v == 2.5 + round);
  CHECK(tutti_barrier(TUTTI_GLOBAL_PROCESS_SET, 60.0) == TUTTI_OK);
}

// One rank of a job of `size`: init, collectives, shutdown, init again through the same
// store, collectives, shutdown.
int runRank(const std::string& dir, int rank, int size) {
  g_rank = rank;
  FileStore fs{dir};
  tutti_store_t store = storeOf(&fs);
  for (int round = 0; round < 2; ++round) {
    CHECK(tutti_init_with_store(rank, size, &store) == TUTTI_OK);
    CHECK(tutti_is_initialized() == 1);
    CHECK(tutti_rank() == rank && tutti_size() == size);
    CHECK(tutti_local_size() == size && tutti_local_rank() == rank);  // all on this host
    const std::string backend = tutti_cpu_backend();
    CHECK(backend == (size == 1 ? "loopback" : "gloo"));
    collectives(rank, size, round);
    CHECK(tutti_shutdown() == TUTTI_OK);
    CHECK(tutti_is_initialized() == 0);
  }
  CHECK(size == 1 || (fs.sets > 0 && fs.gets > 0));
  return 0;
}

// Rank 0 of 2 whose partner never comes: a timeout naming a key, within the start deadline.
int runAlone(const std::string& dir) {
  g_rank = 0;
  FileStore fs{dir};
  tutti_store_t store = storeOf(&fs);
  const auto t0 = std::chrono::steady_clock::now();
  const tutti_status_t s = tutti_init_with_store(0, 2, &store);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string error = tutti_last_error();
  std::printf("alone: status %d after %.1f s: %s\n", static_cast<int>(s), took, error.c_str());
  std::fflush(stdout);
  CHECK(s == TUTTI_ERR_TIMEOUT);
  CHECK(error.find("test FileStore") != std::string::npos);
  CHECK(error.find("key '") != std::string::npos);
  CHECK(took < 30.0);
  CHECK(tutti_is_initialized() == 0);
  return 0;
}

// Bad arguments, each refused with a message naming what is wrong, before any connection.
int runBadArguments(const std::string& dir) {
  g_rank = 0;
  FileStore fs{dir};
  tutti_store_t store = storeOf(&fs);
  CHECK(tutti_init_with_store(0, 2, nullptr) == TUTTI_ERR_INVALID_ARGUMENT);
  CHECK(std::strstr(tutti_last_error(), "store pointer is null"));
  CHECK(tutti_init_with_store(2, 2, &store) == TUTTI_ERR_INVALID_ARGUMENT);
  CHECK(std::strstr(tutti_last_error(), "rank 2 of size 2"));
  CHECK(tutti_init_with_store(0, 0, &store) == TUTTI_ERR_INVALID_ARGUMENT);
  tutti_store_t bad = store;
  bad.get = nullptr;
  CHECK(tutti_init_with_store(0, 2, &bad) == TUTTI_ERR_INVALID_ARGUMENT);
  CHECK(std::strstr(tutti_last_error(), "get function is null"));
  bad = store;
  bad.struct_size = 8;
  CHECK(tutti_init_with_store(0, 2, &bad) == TUTTI_ERR_INVALID_ARGUMENT);
  CHECK(std::strstr(tutti_last_error(), "struct_size is 8"));
  setenv("TUTTI_CPU_OPERATIONS", "mpi", 1);
  CHECK(tutti_init_with_store(0, 2, &store) == TUTTI_ERR_INVALID_ARGUMENT);
  CHECK(std::strstr(tutti_last_error(), "TUTTI_CPU_OPERATIONS=mpi"));
  unsetenv("TUTTI_CPU_OPERATIONS");
  CHECK(tutti_is_initialized() == 0 && fs.sets == 0);
  return 0;
}

// Forks one child per entry of `jobs` (each returns the child's exit code), waits for all
// within `deadline_s`, kills the rest after it. True when every child exited 0.
template <typename F>
bool runChildren(const char* what, int n, F&& body, double deadline_s) {
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(static_cast<unsigned>(deadline_s) + 5);  // the child's own deadline
      std::_Exit(body(i));
    }
    pids.push_back(pid);
  }
  bool ok = true;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000));
  for (size_t left = pids.size(); left > 0;) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "%s: child %d failed (status 0x%x)\n", what, done, status);
        ok = false;
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "%s: deadline of %.0f s passed; killing the children\n", what,
                   deadline_s);
      for (pid_t p : pids) kill(p, SIGKILL);
      while (waitpid(-1, &status, 0) > 0) {
      }
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::printf("%s: %s\n", what, ok ? "ok" : "FAILED");
  return ok;
}

std::string freshDir(const std::string& root, const std::string& name) {
  const std::string dir = root + "/" + name;
  mkdir(dir.c_str(), 0700);
  return dir;
}

}  // namespace

int main() {
  // No launcher: this test is its own.
  for (const char* v : {"TUTTI_RANK", "TUTTI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "RANK", "WORLD_SIZE",
                        "TUTTI_CPU_OPERATIONS", "TUTTI_RENDEZVOUS_ADDR", "TUTTI_RENDEZVOUS_PORT"})
    unsetenv(v);
  setenv("TUTTI_TIMEOUT_SECONDS", "60", 0);
  char root_template[] = "/tmp/tutti-store-test-XXXXXX";
  const char* root = mkdtemp(root_template);
  if (root == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  bool ok = true;
  for (int size : {1, 2, 3}) {
    const std::string dir = freshDir(root, "job" + std::to_string(size));
    const std::string what = "job of " + std::to_string(size);
    ok &= runChildren(what.c_str(), size, [&](int rank) { return runRank(dir, rank, size); },
                      120);
  }
  {
    const std::string dir = freshDir(root, "alone");
    setenv("TUTTI_START_TIMEOUT_SECONDS", "3", 1);
    ok &= runChildren("a rank that never comes", 1, [&](int) { return runAlone(dir); }, 60);
    unsetenv("TUTTI_START_TIMEOUT_SECONDS");
  }
  {
    const std::string dir = freshDir(root, "bad");
    ok &= runChildren("bad arguments", 1, [&](int) { return runBadArguments(dir); }, 30);
  }
  const std::string cleanup = std::string("rm -rf '") + root + "'";
  if (std::system(cleanup.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", root);
  std::printf("%s\n", ok ? "store_init_test: all passed" : "store_init_test: FAILED");
  return ok ? 0 : 1;
}
