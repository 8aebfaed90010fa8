#include "core/timeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace tutti {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(c));
      out += hex;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

bool isDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// A buffer larger than this is written at once rather than at the end of the round.
constexpr size_t kFlushBytes = 1 << 20;

}  // namespace

std::string Timeline::fileFor(const std::string& path, int rank) {
  if (path.empty() || path == "DYNAMIC") return "";
  if (path.back() == '/' || isDirectory(path))
    return path + (path.back() == '/' ? "" : "/") + "rank-" + std::to_string(rank) + ".json";
  return rank == 0 ? path : "";
}

int Timeline::openFile(const std::string& file, const std::string& setting, int rank) {
  auto slash = file.rfind('/');
  if (slash != std::string::npos && slash > 0) ::mkdir(file.substr(0, slash).c_str(), 0777);
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0)
    throwError(StatusCode::kInvalidArgument, "timeline '" + setting + "': rank " +
                                                 std::to_string(rank) + " cannot create " +
                                                 file + ": " + std::strerror(errno));
  return fd;
}

void Timeline::probe(const std::string& file, const std::string& setting, int rank) {
  ::close(openFile(file, setting, rank));
}

Timeline::Timeline(const std::string& file, const std::string& setting, int rank,
                   JobClock clock, bool mark_cycles)
    : file_(file), fd_(openFile(file, setting, rank)), pid_(rank), clock_(clock),
      mark_cycles_(mark_cycles) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string p = std::to_string(pid_);
  buf_ = "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + p +
         ",\"args\":{\"name\":\"rank " + p + "\"}}";
  buf_ += ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + p +
          ",\"args\":{\"sort_index\":" + p + "}}";
  buf_ += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + p +
          ",\"tid\":0,\"args\":{\"name\":\"rounds\"}}";
  // The job clock: ts 0 is rank 0's clock at init, start_time_since_epoch_in_micros its
  // wall-clock time then; offset and error as measured against rank 0.
  buf_ += ",\n{\"name\":\"job_clock\",\"ph\":\"M\",\"pid\":" + p +
          ",\"args\":{\"start_time_since_epoch_in_micros\":" + std::to_string(clock_.epoch_us) +
          ",\"offset_us\":" + std::to_string(clock_.offset_us) +
          ",\"error_us\":" + std::to_string(clock_.error_us) + "}}";
  writeOut();
}

Timeline::~Timeline() { close(); }

void Timeline::writeOut() {
  size_t done = 0;
  while (fd_ >= 0 && done < buf_.size()) {
    ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // a full disk: the events are lost, the job goes on
    done += static_cast<size_t>(n);
  }
  buf_.clear();
}

void Timeline::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!buf_.empty()) writeOut();
}

void Timeline::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  buf_ += "\n]\n";
  writeOut();
  ::close(fd_);
  fd_ = -1;
}

Timeline::Row& Timeline::row(int set, OpType op, const std::string& name) {
  std::string key = name;
  key += '\x1f';
  key += std::to_string(set);
  auto it = rows_.find(key);
  if (it != rows_.end()) return it->second;
  const int tid = static_cast<int>(rows_.size()) + 1;
  const std::string prefix = std::string(opTypeName(op)) + ".";
  std::string label = name.compare(0, prefix.size(), prefix) == 0 ? name : prefix + name;
  if (set != 0) label += " (set " + std::to_string(set) + ")";
  buf_ += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid_) +
          ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"name\":" + quoted(label) + "}}";
  return rows_.emplace(std::move(key), Row{tid}).first->second;
}

void Timeline::event(const char* ph, int tid, const char* name, const std::string& args) {
  buf_ += ",\n{";
  if (name) buf_ += "\"name\":" + quoted(name) + ",";
  buf_ += "\"ph\":\"";
  buf_ += ph;
  buf_ += "\",\"ts\":" + std::to_string(clock_.now()) + ",\"pid\":" + std::to_string(pid_) +
          ",\"tid\":" + std::to_string(tid);
  if (ph[0] == 'i') buf_ += ",\"s\":\"t\"";
  if (!args.empty()) buf_ += ",\"args\":{" + args + "}";
  buf_ += "}";
  if (buf_.size() > kFlushBytes) writeOut();
}

void Timeline::begin(int set, OpType op, const std::string& name, const char* phase,
                     const std::string& args) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  Row& r = row(set, op, name);
  ++r.open;
  event("B", r.tid, phase, args);
}

void Timeline::end(int set, OpType op, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  Row& r = row(set, op, name);
  if (r.open == 0) return;
  --r.open;
  event("E", r.tid, nullptr, "");
}

void Timeline::endAll(int set, OpType op, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  Row& r = row(set, op, name);
  for (; r.open > 0; --r.open) event("E", r.tid, nullptr, "");
}

void Timeline::complete(int tid, const char* name, int64_t start_us, int64_t end_us) {
  buf_ += ",\n{\"name\":" + quoted(name) + ",\"ph\":\"X\",\"ts\":" + std::to_string(start_us) +
          ",\"dur\":" + std::to_string(end_us > start_us ? end_us - start_us : 0) +
          ",\"pid\":" + std::to_string(pid_) + ",\"tid\":" + std::to_string(tid) + "}";
}

void Timeline::queued(int set, OpType op, const std::string& name, int64_t submit_us) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  Row& r = row(set, op, name);
  if (r.dequeued_at >= submit_us) {  // the round was first
    complete(r.tid, "QUEUED", submit_us, r.dequeued_at);
  } else {
    r.queued_at = submit_us;
  }
  r.dequeued_at = -1;
}

void Timeline::dequeued(int set, OpType op, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  Row& r = row(set, op, name);
  const int64_t now = clock_.now();
  if (r.queued_at >= 0) {
    complete(r.tid, "QUEUED", r.queued_at, now);
    r.queued_at = -1;
  } else {
    r.dequeued_at = now;
  }
}

void Timeline::instant(int set, OpType op, const std::string& name, const char* what,
                       const std::string& args) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  event("i", row(set, op, name).tid, what, args);
}

void Timeline::round(int64_t start_us, const std::string& args) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  complete(0, "ROUND", start_us, clock_.now());
  if (!args.empty()) buf_.insert(buf_.size() - 1, ",\"args\":{" + args + "}");
}

void Timeline::cycleMark() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  event("i", 0, "CYCLE_START", "");
}

const char* negotiatePhaseName(OpType op) {
  static const char* const names[kNumOpTypes] = {
      "NEGOTIATE_ALLREDUCE", "NEGOTIATE_ALLGATHER", "NEGOTIATE_BROADCAST",
      "NEGOTIATE_ALLTOALL", "NEGOTIATE_REDUCESCATTER", "NEGOTIATE_BARRIER",
      "NEGOTIATE_JOIN", "NEGOTIATE_ADD_PROCESS_SET", "NEGOTIATE_REMOVE_PROCESS_SET"};
  const int i = static_cast<int>(op);
  return i >= 0 && i < kNumOpTypes ? names[i] : "NEGOTIATE";
}

const char* opPhaseName(OpType op) {
  static const char* const names[kNumOpTypes] = {
      "ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER",
      "BARRIER", "JOIN", "ADD_PROCESS_SET", "REMOVE_PROCESS_SET"};
  const int i = static_cast<int>(op);
  return i >= 0 && i < kNumOpTypes ? names[i] : "OP";
}

}  // namespace tutti
