#include "core/settings_agreement.h"

#include "base/common.h"

#include <algorithm>
#include <map>
#include <sstream>

namespace tutti {
namespace {

// A rank's values by name; false when the line is not NAME=value words of printable text.
bool parseLine(const std::string& line, std::map<std::string, std::string>* values) {
  std::istringstream in(line);
  for (std::string word; in >> word;) {
    const auto eq = word.find('=');
    if (eq == 0 || eq == std::string::npos || word.size() > 256) return false;
    for (char ch : word)
      if (ch < 0x21 || ch > 0x7e) return false;
    (*values)[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return true;
}

std::string shown(const std::map<std::string, std::string>& values, const std::string& name) {
  auto it = values.find(name);
  return it == values.end() ? "(not known to that rank's build)" : it->second;
}

}  // namespace

std::string settingsLine(const Config& config) {
  std::string line;
  for (const auto& var : configTable())
    if (var.across == AcrossRanks::kMustAgree && var.value)
      line += (line.empty() ? "" : " ") + std::string(var.name) + "=" + var.value(config);
  return line;
}

std::string settingsMismatch(const std::vector<std::string>& lines) {
  std::vector<std::map<std::string, std::string>> values(lines.size());
  for (size_t r = 0; r < lines.size(); ++r)
    if (!parseLine(lines[r], &values[r]))
      return "settings from rank " + std::to_string(r) + " are malformed: '" +
             lines[r].substr(0, 120) + "' (a rank of another Tutti build?)";
  std::string message;
  for (const auto& var : configTable()) {
    if (var.across != AcrossRanks::kMustAgree) continue;
    const std::string name = var.name;
    const std::string first = shown(values[0], name);
    std::vector<int> differ;
    for (size_t r = 1; r < lines.size(); ++r)
      if (shown(values[r], name) != first) differ.push_back(static_cast<int>(r));
    if (differ.empty()) continue;
    std::string clause = name + " is " + shown(values[differ[0]], name) + " on rank " +
                         std::to_string(differ[0]) + " but " + first + " on rank 0";
    if (differ.size() > 1)
      clause += " (it differs from rank 0's on " + std::to_string(differ.size()) +
                " ranks: " + joinInts(std::vector<int>(differ.begin(), differ.begin() +
                                                       std::min<size_t>(differ.size(), 8))) +
                (differ.size() > 8 ? ", ..." : "") + ")";
    message += (message.empty() ? "" : "; ") + clause;
  }
  if (message.empty()) return "";
  return message + " (set it the same on every rank, or leave it unset, and check HOROVOD_ "
                   "twins in each node's environment; docs/env_vars.md)";
}

void agreeSettings(const Config& config, ControlPlane& global, Deadline deadline) {
  const std::vector<std::string> lines = exchangeLines(global, settingsLine(config), deadline);
  if (static_cast<int>(lines.size()) != global.size())
    throwError(StatusCode::kInternal, "settings agreement: " + std::to_string(lines.size()) +
                                          " lines for " + std::to_string(global.size()) +
                                          " ranks");
  const std::string mismatch = settingsMismatch(lines);
  if (!mismatch.empty())
    throwError(StatusCode::kMismatch, "rank " + std::to_string(global.rank()) +
                                          ": ranks disagree on settings: " + mismatch);
}

}  // namespace tutti
