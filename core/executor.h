// Runs the agreed responses on this rank: packs fused tensors into the fusion buffer, calls
// the first backend that supports the op, unpacks, applies scale factors and completes the
// handles. Owned by the execution stream (core/exec_stream.h) and used only by the commands
// it runs: one thread at a time, its own or the background thread when it runs a command
// inline.
//
// Each tensor's row of the timeline (when one is given) shows, inside the op's span
// (ALLREDUCE, ...): PACK (copy into the fusion buffer, prescale), the backend call
// ("GLOO_ALLREDUCE", with the backend and the bytes), UNPACK (average, postscale, copy
// out) and CALLBACK (completing the handle, the caller's callback included). The counters
// (core/stats.h) get the same phases' times.
#pragma once

#include "core/config.h"
#include "core/handle_table.h"
#include "core/fusion.h"
#include "core/process_set.h"
#include "core/stats.h"
#include "core/timeline.h"

#include <optional>
#include <vector>

namespace tutti {

class Executor {
 public:
  Executor(const Config& config, Stats& stats) : config_(config), stats_(stats) {}

  // Runs `response` for `set` (this rank is a member); `timeline` may be null (off). A
  // tensor this rank does not hold (it has joined) contributes zeros to an allreduce.
  // Throws Error when a backend fails, naming the op, the tensors, the process set, its
  // ranks and the backend; the caller treats that as fatal.
  void run(const Response& response, ProcessSet& set, Timeline* timeline);

 private:
  void execute(const Response& response, ProcessSet& set);
  Backend* pick(ProcessSet& set, OpType op, DataType dtype, DeviceType device) const;
  void allreduce(const Response& r, ProcessSet& set, Backend& b,
                 std::vector<TensorQueue::Taken>& entries);
  // Fills pieces_ with the entries of a fused allreduce (a joined rank's share has no input
  // or output). False where a tensor's output overlaps another tensor's input or output, or
  // its own input other than exactly (in place): then the fusion buffer is used.
  bool piecesFor(const Response& r, const std::vector<TensorQueue::Taken>& entries);
  void allgather(const Response& r, ProcessSet& set, Backend& b, TensorEntry& e);
  void alltoall(const Response& r, ProcessSet& set, Backend& b, TensorEntry& e);
  void reducescatter(const Response& r, ProcessSet& set, Backend& b, TensorEntry& e);

  // The timeline phase `name` on every tensor of the response running now (when on).
  void phase(const char* name, const std::string& args = "");
  void phaseEnd();
  // The backend call: timeline phase, counters, the call itself.
  template <typename Call>
  void callBackend(Backend& b, int64_t tensors, int64_t bytes, Call&& call);
  // `work` as the timeline phase `name`, its time added to the counter `what`.
  template <typename Work>
  void timed(StatTime what, const char* name, Work&& work);
  // Completes `e` (its callback runs here) as the CALLBACK phase; its waiters wake once
  // the whole response has run (one wake-up per fused batch).
  void complete(TensorEntry& e, const Status& status = Status::OK());

  const Config& config_;
  Stats& stats_;
  Timeline* timeline_ = nullptr;      // during run()
  const Response* current_ = nullptr;  // during run()
  int set_id_ = 0;                     // during run()
  HandleTable* handles_ = nullptr;     // during run(): whose waiters to wake at its end
  FusionBuffer fusion_;
  std::vector<AllreducePiece> pieces_;  // piecesFor's; kept to save the allocation
  struct Span {
    uintptr_t begin, end;
    size_t piece;
    bool written;
  };
  std::vector<Span> spans_;  // piecesFor's scratch
  std::vector<TensorQueue::Taken> batch_;  // execute()'s entries; empty between ops
};

}  // namespace tutti
