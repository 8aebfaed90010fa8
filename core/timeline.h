// TUTTI_TIMELINE: a Chrome trace (chrome://tracing, Perfetto) of this rank's ops. Each tensor
// name gets its own row; a row shows NEGOTIATE (from submit until every rank agreed) and then
// the op itself (ALLREDUCE, ...), with the fused batch size as an argument. Thread-safe.
#pragma once

#include <chrono>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>

namespace tutti {

class Timeline {
 public:
  // Writes to `path` (with ".<rank>" appended when the job has more than one rank).
  // Throws Error(kInvalidArgument) if the file cannot be created.
  Timeline(const std::string& path, int rank, int size);
  ~Timeline();

  void begin(const std::string& tensor, const char* activity, const std::string& args = "");
  void end(const std::string& tensor);

 private:
  int row(const std::string& tensor);  // under mu_
  void write(const std::string& event);

  std::mutex mu_;
  std::ofstream out_;
  int pid_;
  bool first_ = true;
  std::chrono::steady_clock::time_point start_;
  std::unordered_map<std::string, int> rows_;
};

}  // namespace tutti
