// The first error of something that several threads may fail at once (a group, a transport):
// the first set() sticks, later ones are ignored, and every later check reports that first
// one. Thread-safe; isSet() is a lock-free load, cheap enough for a wait loop.
#pragma once

#include "base/common.h"

#include <atomic>
#include <mutex>
#include <string>

namespace tutti {

class FirstError {
 public:
  // Records the error unless one is there; true if this call recorded it.
  bool set(StatusCode code, const std::string& message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (set_.load(std::memory_order_relaxed)) return false;
    code_ = code;
    message_ = message;
    set_.store(true, std::memory_order_release);
    return true;
  }
  bool isSet() const { return set_.load(std::memory_order_acquire); }
  // Throws Error(code, prefix + message) once set; returns otherwise.
  void throwIfSet(const std::string& prefix = std::string()) const {
    if (!isSet()) return;
    std::lock_guard<std::mutex> lock(mu_);
    throw Error(code_, prefix + message_);
  }
  Status status() const {  // OK while unset
    if (!isSet()) return Status::OK();
    std::lock_guard<std::mutex> lock(mu_);
    return Status(code_, message_);
  }

 private:
  mutable std::mutex mu_;
  std::atomic<bool> set_{false};
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace tutti
