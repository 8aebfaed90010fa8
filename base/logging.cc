#include "base/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace tutti {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
std::atomic<bool> g_time{false};

// "2026-05-01 12:00:00.123456 ": local time to the microsecond, as Horovod's log lines have it.
std::string timestampNow() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const long micros = static_cast<long>(
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000);
  std::tm local{};
  localtime_r(&seconds, &local);
  char text[64];
  const size_t n = std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", &local);
  std::snprintf(text + n, sizeof(text) - n, ".%06ld ", micros < 0 ? 0 : micros);
  return text;
}
}  // namespace

const char* logLevelName(LogLevel level) {
  static const char* const kNames[kNumLogLevels] = {"trace", "debug", "info",
                                                    "warning", "error", "fatal"};
  return kNames[static_cast<int>(level)];
}

void setLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
void setLogRank(int rank) { g_rank = rank; }
void setLogTime(bool on) { g_time = on; }
bool logEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void logLine(LogLevel level, const std::string& message) {
  std::string line = g_time ? timestampNow() : std::string();
  line += "[tutti " + std::string(logLevelName(level));
  if (g_rank >= 0) line += " rank " + std::to_string(g_rank.load());
  line += "] " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines never interleave
}

}  // namespace tutti
