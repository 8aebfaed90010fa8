#include "core/timeline.h"

#include "core/common.h"

namespace tutti {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

}  // namespace

Timeline::Timeline(const std::string& path, int rank, int size)
    : pid_(rank), start_(std::chrono::steady_clock::now()) {
  std::string file = size > 1 ? path + "." + std::to_string(rank) : path;
  out_.open(file);
  if (!out_)
    throwError(StatusCode::kInvalidArgument, "TUTTI_TIMELINE='" + path + "': cannot create " + file);
  out_ << "[\n";
}

Timeline::~Timeline() {
  std::lock_guard<std::mutex> lock(mu_);
  out_ << "\n]\n";
}

int Timeline::row(const std::string& tensor) {
  auto it = rows_.find(tensor);
  if (it != rows_.end()) return it->second;
  int id = static_cast<int>(rows_.size()) + 1;
  rows_[tensor] = id;
  write("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid_) +
        ",\"tid\":" + std::to_string(id) + ",\"args\":{\"name\":" + quoted(tensor) + "}}");
  return id;
}

void Timeline::write(const std::string& event) {
  out_ << (first_ ? "" : ",\n") << event;
  first_ = false;
}

void Timeline::begin(const std::string& tensor, const char* activity, const std::string& args) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::steady_clock::now() - start_).count();
  std::lock_guard<std::mutex> lock(mu_);
  int tid = row(tensor);
  write("{\"name\":" + quoted(activity) + ",\"ph\":\"B\",\"ts\":" + std::to_string(us) +
        ",\"pid\":" + std::to_string(pid_) + ",\"tid\":" + std::to_string(tid) +
        (args.empty() ? "" : ",\"args\":{" + args + "}") + "}");
}

void Timeline::end(const std::string& tensor) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::steady_clock::now() - start_).count();
  std::lock_guard<std::mutex> lock(mu_);
  int tid = row(tensor);
  write("{\"ph\":\"E\",\"ts\":" + std::to_string(us) + ",\"pid\":" + std::to_string(pid_) +
        ",\"tid\":" + std::to_string(tid) + "}");
}

}  // namespace tutti
