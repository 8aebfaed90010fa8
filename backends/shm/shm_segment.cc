#include "backends/shm/shm_segment.h"

#include "base/host_identity.h"
#include "base/logging.h"

#include <fcntl.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <sstream>
#include <thread>

namespace tutti {
namespace detail {

constexpr uint64_t kMagic = 0x316d73697474'7574ull;  // "tuttism1"
constexpr size_t kPage = 4096;

struct ShmHeader {
  uint64_t magic;
  int32_t size;
  int32_t id;
  int64_t buffer_bytes;
  int32_t spins;  // the root's choice for every member's waits (see create)
  alignas(128) std::atomic<int32_t> poison;  // 0 clean, 1 being written, 2 poisoned
  int32_t poison_code;
  char reason[1024];
};

// One cache-line pair per member, so that one member's arrivals do not slow another's.
struct alignas(128) ShmRankState {
  std::atomic<uint64_t> seq;
  // A wait that lasts sleeps on `wake` (a futex word shared by the processes), counted in
  // `sleepers`; the member bumps `wake` after each new seq and wakes them if any sleep.
  std::atomic<uint32_t> wake;
  std::atomic<uint32_t> sleepers;
  int64_t pid;
  uint64_t start_time;
  int32_t world_rank;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shm needs lock-free 64-bit atomics");
static_assert(std::atomic<int32_t>::is_always_lock_free, "shm needs lock-free 32-bit atomics");

namespace {

struct ProcState {
  bool exists = false;
  char state = '?';
  uint64_t start_time = 0;
};

// /proc/<pid>/stat: the state (field 3) and the start time in clock ticks (field 22).
ProcState procState(int64_t pid) {
  ProcState p;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return p;
  auto close = line.rfind(')');
  if (close == std::string::npos) return p;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 3) p.state = field.empty() ? '?' : field[0];
    if (i == 22) {
      p.start_time = std::strtoull(field.c_str(), nullptr, 10);
      p.exists = true;
    }
  }
  return p;
}

bool alive(const ProcState& p, uint64_t start_time) {
  return p.exists && p.start_time == start_time && p.state != 'Z' && p.state != 'X';
}

std::string stateText(const ProcState& p) {
  switch (p.state) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "in uninterruptible sleep";
    case 'T': return "stopped";
    case 't': return "stopped by a debugger";
    default: return std::string("state ") + p.state;
  }
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

std::string uniqueName(int id) {
  std::random_device random;
  std::ostringstream name;
  name << "/tutti-" << getpid() << "-" << id << "-" << std::hex << random() << random();
  return name.str();
}

size_t dataOffset(int size) {
  size_t bytes = sizeof(ShmHeader) + sizeof(ShmRankState) * static_cast<size_t>(size);
  return (bytes + kPage - 1) / kPage * kPage;
}

// Maps the object behind `fd`; nullptr with errno set on failure.
void* mapFd(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// This process's mappings by segment name. Members that are threads of one process (the
// threads-as-ranks tests) share one mapping, so that ThreadSanitizer sees their accesses
// to the same memory at the same addresses.
struct Mapping {
  void* base;
  int users;
};
std::mutex& mappingsMutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, Mapping>& mappings() {
  static std::map<std::string, Mapping> all;
  return all;
}
void* sharedMapping(const std::string& name) {
  std::lock_guard<std::mutex> lock(mappingsMutex());
  auto it = mappings().find(name);
  if (it == mappings().end()) return nullptr;
  ++it->second.users;
  return it->second.base;
}
void addMapping(const std::string& name, void* base) {
  std::lock_guard<std::mutex> lock(mappingsMutex());
  mappings()[name] = Mapping{base, 1};
}
void releaseMapping(const std::string& name, void* base, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mappingsMutex());
    auto it = mappings().find(name);
    if (it != mappings().end() && --it->second.users > 0) return;
    if (it != mappings().end()) mappings().erase(it);
  }
  munmap(base, bytes);
}

std::string errnoText(const std::string& call, const std::string& name) {
  return call + "(" + name + ") failed: " + std::strerror(errno);
}

// The setup's messages: "0" / "1" (TUTTI_SHM), host identity, pid and start time.
struct MemberInfo {
  bool enabled = false;
  int64_t buffer_bytes = 0;  // asked for (TUTTI_SHM_BUFFER_BYTES; 0: auto)
  std::string host;
  int64_t pid = 0;
  uint64_t start_time = 0;
  std::vector<int> cpus;  // the member's affinity mask: the CPUs it may run on
};

// Shared (not FUTEX_PRIVATE): the word lives in a mapping of several processes.
void futexWait(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::nanoseconds limit) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex is 32 bits");
  timespec ts{static_cast<time_t>(limit.count() / 1000000000),
              static_cast<long>(limit.count() % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT32_MAX, nullptr,
          nullptr, 0);
}

std::string encodeInfo(bool enabled, int64_t buffer_bytes) {
  std::ostringstream out;
  out << (enabled ? 1 : 0) << " " << buffer_bytes << "\n" << hostIdentity() << "\n" << getpid() << " "
      << procState(getpid()).start_time;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &cpus)) out << " " << c;
  return out.str();
}

MemberInfo decodeInfo(const std::string& bytes) {
  MemberInfo info;
  std::istringstream in(bytes);
  std::string line;
  std::getline(in, line);
  std::istringstream first(line);
  int enabled = 0;
  first >> enabled >> info.buffer_bytes;
  info.enabled = enabled == 1;
  std::getline(in, info.host);
  in >> info.pid >> info.start_time;
  for (int c; in >> c;) info.cpus.push_back(c);
  return info;
}

// Round up to whole pages.
int64_t pages(int64_t bytes) {
  return (bytes + static_cast<int64_t>(kPage) - 1) / static_cast<int64_t>(kPage) *
         static_cast<int64_t>(kPage);
}

}  // namespace

int64_t ShmSegment::autoBufferBytes(int members) {
  // Measured (docs/PERFORMANCE.md, "Step time against DDP: binding, buffers, fusion"): with ranks bound to a core, each
  // chunk's two rounds wait for the peer's thread to get its core back, and 1 MiB chunks
  // made a 16 MiB gradient's allreduce 3x slower than 4 MiB ones. Larger sets get less each
  // (at most 64 MiB per set in /dev/shm).
  const int64_t per = (int64_t(32) << 20) / std::max(members, 1);
  return pages(std::max<int64_t>(int64_t(1) << 20, std::min<int64_t>(int64_t(4) << 20, per)));
}

std::unique_ptr<ShmSegment> ShmSegment::create(ControlPlane& control,
                                               const std::vector<int>& ranks, int id,
                                               const ShmOptions& options,
                                               std::string* why_not) {
  const Deadline deadline = deadlineAfter(options.setup_seconds);
  const int size = control.size(), rank = control.rank();
  std::unique_ptr<ShmSegment> seg(new ShmSegment());
  seg->rank_ = rank;
  seg->size_ = size;
  seg->id_ = id;
  seg->ranks_ = ranks;
  auto sizeFor = [&](int64_t buffer_bytes) {
    seg->buffer_bytes_ = buffer_bytes;
    seg->bytes_ = dataOffset(size) + 2 * static_cast<size_t>(size) * buffer_bytes;
  };
  const int64_t asked = options.buffer_bytes > 0 ? pages(std::max<int64_t>(options.buffer_bytes, 64 << 10)) : 0;

  // 1. Every member tells the root whether it may use shm, the buffer size it asks for, its
  //    host, pid and start time.
  std::vector<std::string> gathered = control.gather(encodeInfo(options.enabled, asked), deadline);
  // 2. The root decides, picks the buffer size, creates and initialises the segment and
  //    sends its name and buffer size, or "!why".
  std::string name;
  if (rank == 0) {
    std::vector<MemberInfo> infos;
    for (const auto& g : gathered) infos.push_back(decodeInfo(g));
    std::string why;
    if (size < 2) why = "a process set of one member";
    for (int r = 0; r < size && why.empty(); ++r) {
      if (!infos[r].enabled) why = "TUTTI_SHM=0 on world rank " + std::to_string(ranks[r]);
      else if (infos[r].host != infos[0].host)
        why = "world ranks " + std::to_string(ranks[0]) + " and " + std::to_string(ranks[r]) +
              " run on different hosts";
      else if (infos[r].buffer_bytes != infos[0].buffer_bytes)
        why = "world ranks " + std::to_string(ranks[0]) + " and " + std::to_string(ranks[r]) +
              " ask for different shm buffers (TUTTI_SHM_BUFFER_BYTES " +
              (infos[0].buffer_bytes ? std::to_string(infos[0].buffer_bytes) : "auto") +
              " and " + (infos[r].buffer_bytes ? std::to_string(infos[r].buffer_bytes) : "auto") +
              ")";
    }
    // An explicit size is tried alone; auto halves while /dev/shm has no room for it.
    for (int64_t buffer = asked ? asked : autoBufferBytes(size); why.empty(); buffer /= 2) {
      sizeFor(buffer);
      name = uniqueName(id);
      int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) {
        why = errnoText("shm_open", name);
        break;
      }
      // Reserve the pages now: a /dev/shm too small (containers default to 64 MiB) must
      // make the set decline shm here (or take a smaller buffer), not kill a process with
      // SIGBUS mid-collective.
      int reserved = 0;
      bool no_room = false;
      if (ftruncate(fd, static_cast<off_t>(seg->bytes_)) != 0) {
        why = errnoText("ftruncate", name);
      } else if ((reserved = posix_fallocate(fd, 0, static_cast<off_t>(seg->bytes_))) != 0) {
        no_room = reserved == ENOSPC && !asked && buffer / 2 >= (64 << 10);
        why = "posix_fallocate(" + name + ", " + std::to_string(seg->bytes_) +
              " bytes) failed: " + std::strerror(reserved) + " (is /dev/shm large enough?)";
      } else if ((seg->base_ = mapFd(fd, seg->bytes_)) == nullptr) {
        why = errnoText("mmap", name);
      } else {
        addMapping(name, seg->base_);
      }
      seg->name_ = name;
      close(fd);
      if (why.empty()) break;
      shm_unlink(name.c_str());
      if (!no_room) break;
      TUTTI_LOG(kDebug) << "process set " << id << ": no room in /dev/shm for "
                        << seg->bytes_ << " bytes of shm buffers; trying half";
      why.clear();
    }
    if (why.empty()) {
      auto* h = new (seg->base_) ShmHeader();
      h->magic = kMagic;
      h->size = size;
      h->id = id;
      h->buffer_bytes = seg->buffer_bytes_;
      // Waits spin first unless the members cannot all run at once: fewer CPUs in the
      // union of their affinity masks than members (more ranks than cores, or ranks
      // confined to the same cores). A waiter then needs its core for the peer it waits
      // for. Each member's own mask says nothing alone: ranks bound to a core each (as
      // mpirun binds by default) have one CPU apiece and still run side by side.
      std::vector<int> all;
      for (const auto& info : infos) all.insert(all.end(), info.cpus.begin(), info.cpus.end());
      std::sort(all.begin(), all.end());
      all.erase(std::unique(all.begin(), all.end()), all.end());
      h->spins = static_cast<int>(all.size()) >= size ? 1000 : 0;
      h->poison.store(0, std::memory_order_relaxed);
      auto* states = reinterpret_cast<ShmRankState*>(static_cast<uint8_t*>(seg->base_) +
                                                     sizeof(ShmHeader));
      for (int r = 0; r < size; ++r) {
        auto* s = new (&states[r]) ShmRankState();
        s->seq.store(0, std::memory_order_relaxed);
        s->wake.store(0, std::memory_order_relaxed);
        s->sleepers.store(0, std::memory_order_relaxed);
        s->pid = infos[r].pid;
        s->start_time = infos[r].start_time;
        s->world_rank = ranks[r];
      }
    }
    name = why.empty() ? std::to_string(seg->buffer_bytes_) + " " + name : "!" + why;
  }
  name = control.broadcast(name, deadline);
  if (!name.empty() && name[0] == '!') {
    if (why_not) *why_not = name.substr(1);
    return nullptr;
  }
  {  // "<buffer bytes> <name>", from the root: checked like any data from another rank
    const size_t space = name.find(' ');
    int64_t buffer = 0;
    try {
      buffer = space == std::string::npos ? 0 : std::stoll(name.substr(0, space));
    } catch (const std::exception&) {
      buffer = 0;
    }
    if (buffer < (64 << 10) || buffer > (int64_t(1) << 30) || buffer % static_cast<int64_t>(kPage))
      throwError(StatusCode::kInternal, "process set " + std::to_string(id) +
                                            ": the root's shm segment message is malformed: '" +
                                            name.substr(0, 80) + "'");
    if (rank != 0) sizeFor(buffer);
    name = name.substr(space + 1);
  }
  // 3. The others map it and check that they see every member's process; each reports.
  std::string problem;
  if (rank != 0) {
    seg->name_ = name;
    seg->base_ = sharedMapping(name);
    int fd = seg->base_ ? -1 : shm_open(name.c_str(), O_RDWR, 0600);
    if (!seg->base_ && fd < 0) {
      problem = errnoText("shm_open", name);
    } else if (!seg->base_) {
      if ((seg->base_ = mapFd(fd, seg->bytes_)) == nullptr)
        problem = errnoText("mmap", name);
      else
        addMapping(name, seg->base_);
      close(fd);
    }
  }
  if (seg->base_) {
    seg->header_ = static_cast<ShmHeader*>(seg->base_);
    seg->states_ = reinterpret_cast<ShmRankState*>(static_cast<uint8_t*>(seg->base_) +
                                                   sizeof(ShmHeader));
    seg->data_ = static_cast<uint8_t*>(seg->base_) + dataOffset(size);
    if (seg->header_->magic != kMagic || seg->header_->size != size ||
        seg->header_->buffer_bytes != seg->buffer_bytes_)
      problem = "segment " + name + " does not match this process set";
    else
      seg->spins_ = seg->header_->spins;
    for (int r = 0; r < size && problem.empty(); ++r)
      if (!alive(procState(seg->states_[r].pid), seg->states_[r].start_time))
        problem = "world rank " + std::to_string(ranks[r]) + "'s process (pid " +
                  std::to_string(seg->states_[r].pid) + ") is not visible from world rank " +
                  std::to_string(ranks[rank]) + " (another pid namespace?)";
  }
  if (!problem.empty()) problem = "world rank " + std::to_string(ranks[rank]) + ": " + problem;
  gathered = control.gather(problem, deadline);
  // 4. The root unlinks the name (every member has mapped it or given up) and says whether
  //    all succeeded.
  std::string verdict;
  if (rank == 0) {
    shm_unlink(name.c_str());
    for (const auto& g : gathered)
      if (!g.empty() && verdict.empty()) verdict = "!" + g;
  }
  verdict = control.broadcast(verdict, deadline);
  if (!verdict.empty()) {
    if (why_not) *why_not = verdict.substr(1);
    return nullptr;  // the destructor unmaps
  }
  return seg;
}

ShmSegment::~ShmSegment() {
  if (base_) releaseMapping(name_, base_, bytes_);
}

std::string ShmSegment::where(const char* op) const {
  // Every op names its group; the names of the members are built once (callgrind: building
  // them each time cost more than a lone small op's other bookkeeping).
  if (where_tail_.empty())
    where_tail_ = " on group " + std::to_string(id_) + " (" +
                  (ranks_.size() <= 16 ? "world ranks " + joinInts(ranks_)
                                       : std::to_string(ranks_.size()) + " ranks") +
                  ")";
  return "rank " + std::to_string(ranks_[rank_]) + ": shm " + op + where_tail_;
}

const uint8_t* ShmSegment::slot(int member) const {
  return data_ + ((epoch_ % 2) * size_ + member) * buffer_bytes_;
}
uint8_t* ShmSegment::slot(int member) {
  return data_ + ((epoch_ % 2) * size_ + member) * buffer_bytes_;
}

std::string ShmSegment::memberName(int member) const {
  return "world rank " + std::to_string(states_[member].world_rank) + " (pid " +
         std::to_string(states_[member].pid) + ")";
}

void ShmSegment::round(Deadline deadline, const What& what) {
  ++seq_;
  ShmRankState& me = states_[rank_];
  // seq_cst with the waiters' (sleepers, then seq): either a waiter sees the new seq, or
  // this sees it counted in sleepers and wakes it.
  me.seq.store(seq_, std::memory_order_seq_cst);
  me.wake.fetch_add(1, std::memory_order_seq_cst);
  if (me.sleepers.load(std::memory_order_seq_cst) != 0) futexWakeAll(me.wake);
  for (int m = 0; m < size_; ++m)
    if (m != rank_) waitFor(m, seq_, deadline, what);
}

void ShmSegment::waitFor(int member, uint64_t target, Deadline deadline, const What& what) {
  using namespace std::chrono;
  const std::atomic<uint64_t>& seq = states_[member].seq;
  // 1. Spin: the common case, a peer a few microseconds behind. Not when the set has more
  //    members than this process may use cores: the peer then needs this core to arrive.
  for (int i = 0; i < spins_; ++i) {
    if (seq.load(std::memory_order_acquire) >= target) return;
    if (header_->poison.load(std::memory_order_relaxed) != 0) break;
    cpuRelax();
  }
  // 2. Yield for a millisecond, then sleep until the member posts, checking the poison,
  //    the deadline and (from the first millisecond on, every 5 ms) the peer's process.
  //    Bounded by the deadline. A wait shorter than that (a peer whose core runs its
  //    backward pass for a moment) reads no /proc file: opening and parsing one took up to
  //    18% of this thread's time in a training step that waited like that every round.
  const auto start = Clock::now();
  auto next_check = start + milliseconds(1);
  for (;;) {
    if (seq.load(std::memory_order_acquire) >= target) return;
    throwIfPoisoned(what);
    const auto now = Clock::now();
    if (now >= next_check) {
      next_check = now + milliseconds(5);
      ProcState p = procState(states_[member].pid);
      if (!alive(p, states_[member].start_time))
        fail(StatusCode::kBackend, what.text() + ": " + memberName(member) +
                                       " died (its process is gone) while this rank waited "
                                       "for it");
      if (now >= deadline)
        fail(StatusCode::kTimeout,
             what.text() + ": timed out after " +
                 secondsText(duration<double>(now - start).count()) + " s waiting for " +
                 memberName(member) + ", which is " + stateText(p));
    }
    // After a millisecond of yields, sleep until the member posts (a futex wake-up), at
    // most 2 ms at a time for the checks above. Short naps instead (20 us each) woke this
    // thread 50,000 times a second while the peer was still in its backward pass, each
    // time preempting the compute that shares its core.
    if (now - start < milliseconds(1)) {
      sched_yield();
      continue;
    }
    ShmRankState& st = states_[member];
    const uint32_t seen = st.wake.load(std::memory_order_seq_cst);
    st.sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (st.seq.load(std::memory_order_seq_cst) < target &&
        header_->poison.load(std::memory_order_acquire) == 0)
      futexWait(st.wake, seen, milliseconds(2));
    st.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmSegment::throwIfPoisoned(const What& what) const {
  if (header_->poison.load(std::memory_order_acquire) != 2) return;
  throwError(static_cast<StatusCode>(header_->poison_code),
             what.text() + ": the group was stopped: " + header_->reason);
}

void ShmSegment::poison(StatusCode code, const std::string& reason) {
  int32_t expected = 0;
  if (!header_->poison.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return;
  header_->poison_code = static_cast<int32_t>(code);
  size_t n = std::min(reason.size(), sizeof(header_->reason) - 1);
  std::memcpy(header_->reason, reason.data(), n);
  header_->reason[n] = '\0';
  header_->poison.store(2, std::memory_order_release);
  for (int m = 0; m < size_; ++m) {  // the members asleep in a wait see it now
    states_[m].wake.fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(states_[m].wake);
  }
}

void ShmSegment::fail(StatusCode code, const std::string& message) {
  poison(code, message);
  throwError(code, message);
}

}  // namespace detail
}  // namespace tutti
