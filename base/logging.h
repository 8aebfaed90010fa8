// Minimal leveled logging to stderr, one whole line per message, prefixed with the rank and,
// when on (TUTTI_LOG_HIDE_TIME=0), the local date and time.
#pragma once

#include <sstream>
#include <string>

namespace tutti {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };
constexpr int kNumLogLevels = 6;

const char* logLevelName(LogLevel level);  // "trace", ..., "fatal" (TUTTI_LOG_LEVEL's values)

void setLogLevel(LogLevel level);
void setLogRank(int rank);
void setLogTime(bool on);  // lines start with "2026-05-01 12:00:00.123456 " when on
bool logEnabled(LogLevel level);
void logLine(LogLevel level, const std::string& message);

namespace detail {
struct Voidify {
  void operator&(std::ostream&) {}
};

class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage() { logLine(level_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace detail

}  // namespace tutti

#define TUTTI_LOG(level)                                 \
  !::tutti::logEnabled(::tutti::LogLevel::level)         \
      ? (void)0                                          \
      : ::tutti::detail::Voidify() &                     \
            ::tutti::detail::LogMessage(::tutti::LogLevel::level).stream()
