// What the Runtime tells about itself: the job clock, the timeline switch, and the startup
// logs (settings in force, topology, backends per set and op).
#include "base/logging.h"
#include "core/runtime.h"

#include <algorithm>
#include <thread>

namespace tutti {
namespace {
// What is said once per job: rank 0 (of the job or set) logs it at info, every rank at debug.
LogLevel startupLevel(int rank) { return rank == 0 ? LogLevel::kInfo : LogLevel::kDebug; }
}  // namespace

std::shared_ptr<Timeline> Runtime::timeline() const {
  if (!timeline_on_.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lock(timeline_mu_);
  return timeline_;
}

Status Runtime::startTimeline(const std::string& path, bool mark_cycles) {
  const std::string file = Timeline::fileFor(path, config_.topology.rank);
  {
    std::lock_guard<std::mutex> lock(timeline_mu_);
    if (timeline_ && !file.empty() && timeline_->file() == file) return Status::OK();
  }
  stopTimeline();
  if (file.empty()) return Status::OK();  // not this rank's (a file path: rank 0 writes it)
  std::shared_ptr<Timeline> tl;
  try {
    tl = std::make_shared<Timeline>(file, path, config_.topology.rank, clock_, mark_cycles);
  } catch (const Error& e) {
    return e.status();
  }
  {
    std::lock_guard<std::mutex> lock(timeline_mu_);
    timeline_ = std::move(tl);
    timeline_on_ = true;
  }
  const LogLevel level = startupLevel(config_.topology.rank);
  if (logEnabled(level))
    logLine(level, "timeline: writing " + file + (mark_cycles ? " (cycles marked)" : ""));
  return Status::OK();
}

void Runtime::stopTimeline() {
  std::shared_ptr<Timeline> tl;
  {
    std::lock_guard<std::mutex> lock(timeline_mu_);
    timeline_on_ = false;
    tl = std::move(timeline_);
  }
  if (!tl) return;
  // The round in progress keeps its events (an op that just completed still closes its
  // phases): wait, boundedly, until the background thread lets go of the timeline at the
  // end of its round. A round blocked in a collective does not hold the caller up long.
  if (!onBackgroundThread()) {
    const Deadline until = deadlineAfter(1.0);
    while (tl.use_count() > 1 && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  tl->close();  // whoever still holds it writes nothing more
}

void Runtime::syncClock(ProcessSet& global) {
  const Deadline deadline = deadlineAfter(config_.start_timeout_seconds);
  clock_ = syncJobClock(*global.control, deadline);
  // Rank 0 names the largest error; a timeline's events of two ranks are ordered right
  // when they lie further apart than the two ranks' errors.
  auto errors = global.control->gather(std::to_string(clock_.error_us), deadline);
  if (global.rank != 0 || !logEnabled(LogLevel::kInfo)) return;
  int64_t worst = 0;
  int worst_rank = 0;
  for (size_t r = 0; r < errors.size(); ++r) {
    int64_t e = std::strtoll(errors[r].c_str(), nullptr, 10);
    if (e > worst) {
      worst = e;
      worst_rank = static_cast<int>(r);
    }
  }
  TUTTI_LOG(kInfo) << "job clock: every rank's offset to rank 0 measured; largest error +-"
                   << worst << " us (rank " << worst_rank << ")";
}

void Runtime::logStartup() const {
  const LogLevel level = startupLevel(config_.topology.rank);
  if (!logEnabled(level)) return;
  std::string settings = "settings in force:";
  for (const auto& line : settingsInForce(config_)) settings += "\n  " + line;
  logLine(level, settings);
  const Topology& t = config_.topology;
  logLine(level, "topology: " + std::to_string(t.size) + " rank(s) from " + t.source + ", " +
                     std::to_string(t.cross_size) + " host(s) of up to " +
                     std::to_string(t.local_size) + " (measured); this rank " +
                     std::to_string(t.rank) + ": local rank " + std::to_string(t.local_rank) +
                     " of " + std::to_string(t.local_size) + ", cross rank " +
                     std::to_string(t.cross_rank) + " of " + std::to_string(t.cross_size) +
                     "; " + transport_->name() + " transport");
  logLine(level, std::string("pipelined rounds ") + (stream_.threaded() ? "on" : "off") +
                     " (TUTTI_PIPELINE=" + config_.pipeline + "; " +
                     std::to_string(std::thread::hardware_concurrency()) + " cores for " +
                     std::to_string(t.local_size) + " rank(s) on this host)");
}

void Runtime::logSetBackends(const ProcessSet& set) const {
  const LogLevel level = startupLevel(set.rank);
  if (!logEnabled(level)) return;
  static const OpType ops[] = {OpType::kAllreduce, OpType::kAllgather, OpType::kBroadcast,
                               OpType::kAlltoall, OpType::kReducescatter};
  std::string text = "process set " + std::to_string(set.id) + " (ranks " + joinInts(set.ranks) +
                     "): connected over " + transport_->name() + "; backends in order:";
  for (const auto& b : set.backends) text += std::string(" ") + b->name();
  for (DeviceType device : {DeviceType::kCpu, DeviceType::kCuda}) {
    text += std::string("; ") + deviceTypeName(device) + ":";
    for (OpType op : ops) {
      const char* who = "none";
      for (const auto& b : set.backends)
        if (b->supports(op, DataType::kFloat32, device)) {
          who = b->name();
          break;
        }
      text += std::string(" ") + opTypeName(op) + "=" + who;
    }
  }
  logLine(level, text);
}

}  // namespace tutti
