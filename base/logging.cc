#include "base/logging.h"

#include <atomic>
#include <cstdio>

namespace tutti {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
}  // namespace

const char* logLevelName(LogLevel level) {
  static const char* const kNames[kNumLogLevels] = {"trace", "debug", "info",
                                                    "warning", "error", "fatal"};
  return kNames[static_cast<int>(level)];
}

void setLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
void setLogRank(int rank) { g_rank = rank; }
bool logEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void logLine(LogLevel level, const std::string& message) {
  std::string line = "[tutti " + std::string(logLevelName(level));
  if (g_rank >= 0) line += " rank " + std::to_string(g_rank.load());
  line += "] " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines never interleave
}

}  // namespace tutti
