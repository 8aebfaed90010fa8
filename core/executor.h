// Runs the agreed responses on this rank: packs fused tensors into the fusion buffer, calls
// the first backend that supports the op, unpacks, applies scale factors and completes the
// handles. Background thread only.
#pragma once

#include "core/config.h"
#include "core/fusion.h"
#include "core/process_set.h"
#include "core/timeline.h"

#include <optional>
#include <vector>

namespace tutti {

class Executor {
 public:
  // `timeline` may be null (TUTTI_TIMELINE unset).
  Executor(const Config& config, Timeline* timeline) : config_(config), timeline_(timeline) {}

  // Runs `response` for `set` (this rank is a member). A tensor this rank does not hold
  // (it has joined) contributes zeros to an allreduce. Throws Error when a backend fails;
  // the caller treats that as fatal.
  void run(const Response& response, ProcessSet& set);

 private:
  void execute(const Response& response, ProcessSet& set);
  Backend* pick(ProcessSet& set, OpType op, DataType dtype, DeviceType device) const;
  void allreduce(const Response& r, ProcessSet& set, Backend& b,
                 std::vector<std::optional<TensorEntry>>& entries);
  void allgather(const Response& r, ProcessSet& set, Backend& b, TensorEntry& e);
  void alltoall(const Response& r, ProcessSet& set, Backend& b, TensorEntry& e);
  void reducescatter(const Response& r, ProcessSet& set, Backend& b, TensorEntry& e);

  const Config& config_;
  Timeline* timeline_;
  FusionBuffer fusion_;
};

}  // namespace tutti
