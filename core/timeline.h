// The timeline: a Chrome trace (chrome://tracing, Perfetto, `tutti-timeline merge`) of one
// rank's ops, on the job clock (core/job_clock.h) so that ranks line up.
//
// Layout: process = rank; one row per tensor ("allreduce.grad.w"; "... (set 2)" for a
// process set other than 0) showing its phases as nested begin/end events, and row 0,
// "rounds", with one ROUND span per round that had work (bytes fused, cache hits) and,
// with mark_cycles, a CYCLE_START mark per round.
//
// Crash safety: events are kept in memory and written with write(2) per batch (the
// background thread flushes after every round), so a rank killed by any signal leaves a
// file that is valid JSON up to its missing closing bracket, which chrome://tracing,
// Perfetto and `tutti-timeline merge` accept. close() completes the array.
//
// Thread-safe. After close() every call is a no-op.
#pragma once

#include "base/common.h"
#include "core/job_clock.h"

#include <mutex>
#include <string>
#include <unordered_map>

namespace tutti {

class Timeline {
 public:
  // Where rank `rank` writes for the setting `path` (TUTTI_TIMELINE, start_timeline):
  // "dir/rank-N.json" when `path` ends with '/' or is a directory (every rank writes);
  // `path` itself on rank 0 for a file path (as Horovod's HOROVOD_TIMELINE); "" (no file)
  // on the other ranks, and for "" and "DYNAMIC" (Horovod's "start it later").
  static std::string fileFor(const std::string& path, int rank);

  // Creates `file` (and its directory, one level) and closes it again: init checks that
  // the timeline can be written before it connects. Throws like the constructor.
  static void probe(const std::string& file, const std::string& setting, int rank);

  // Creates `file` (and its directory, one level). Throws Error(kInvalidArgument) naming
  // `setting` when it cannot.
  Timeline(const std::string& file, const std::string& setting, int rank, JobClock clock,
           bool mark_cycles);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  const std::string& file() const { return file_; }
  bool markCycles() const { return mark_cycles_; }

  // Phases of a tensor's row. `args` is the inside of a JSON object ("\"bytes\":12") or "".
  // end() closes the innermost open phase of the row and does nothing when none is open
  // (a tensor this rank never held, or a timeline started mid-op).
  void begin(int set, OpType op, const std::string& name, const char* phase,
             const std::string& args = "");
  void end(int set, OpType op, const std::string& name);
  // end() for every open phase of the row.
  void endAll(int set, OpType op, const std::string& name);
  // QUEUED (submit → the round picks the request up) as one complete event. Submit and the
  // round run on different threads and either call may come first: `submit_us` (now(),
  // read before the request became visible to the round) orders them.
  void queued(int set, OpType op, const std::string& name, int64_t submit_us);
  void dequeued(int set, OpType op, const std::string& name);
  // A mark on the tensor's row (rank 0 of a set: "a rank's request arrived").
  void instant(int set, OpType op, const std::string& name, const char* what,
               const std::string& args);

  // The rounds row: a ROUND span from `start_us` (job time, from now()) until now.
  void round(int64_t start_us, const std::string& args);
  void cycleMark();
  int64_t now() const { return clock_.now(); }

  // Writes what is buffered (write(2), whole events only).
  void flush();
  // Flushes, completes the JSON array and closes the file. Idempotent.
  void close();

 private:
  struct Row {
    int tid;
    int open = 0;
    int64_t queued_at = -1, dequeued_at = -1;  // the half of QUEUED that came first
  };
  void complete(int tid, const char* name, int64_t start_us, int64_t end_us);  // under mu_
  static int openFile(const std::string& file, const std::string& setting, int rank);
  Row& row(int set, OpType op, const std::string& name);  // under mu_
  void event(const char* ph, int tid, const char* name, const std::string& args);  // under mu_
  void writeOut();  // under mu_

  std::mutex mu_;
  std::string file_;
  int fd_ = -1;
  int pid_;
  JobClock clock_;
  bool mark_cycles_;
  std::string buf_;
  std::unordered_map<std::string, Row> rows_;
};

// Phase names, as Horovod's timeline has them: "NEGOTIATE_ALLREDUCE", "ALLREDUCE".
const char* negotiatePhaseName(OpType op);
const char* opPhaseName(OpType op);

}  // namespace tutti
