#include "core/runtime.h"

#include "backends/registry.h"
#include "core/logging.h"
#include "core/validation.h"

#include <algorithm>

namespace tutti {
namespace {

bool bitSet(const std::vector<uint64_t>& bits, size_t i) { return (bits[i / 64] >> (i % 64)) & 1u; }
void clearBit(std::vector<uint64_t>& bits, size_t i) { bits[i / 64] &= ~(uint64_t(1) << (i % 64)); }

}  // namespace

Runtime::Runtime(Config config) : Runtime(config, makeTransport(config)) {}

Runtime::Runtime(Config config, std::unique_ptr<Transport> transport)
    : config_(std::move(config)), transport_(std::move(transport)), executor_(config_) {
  setLogLevel(config_.log_level);
  setLogRank(config_.topology.size > 1 ? config_.topology.rank : -1);
  if (transport_->rank() != config_.topology.rank || transport_->size() != config_.topology.size)
    throwError(StatusCode::kInvalidArgument,
               "rank " + std::to_string(config_.topology.rank) + ": the launcher says rank " +
                   std::to_string(config_.topology.rank) + " of " +
                   std::to_string(config_.topology.size) + " but the " + transport_->name() +
                   " transport says rank " + std::to_string(transport_->rank()) + " of " +
                   std::to_string(transport_->size()));
  std::vector<int> all(config_.topology.size);
  for (int i = 0; i < config_.topology.size; ++i) all[i] = i;
  createSet(0, all);
  running_ = true;
  thread_ = std::thread([this] { loop(); });
  TUTTI_LOG(kInfo) << "initialized: rank " << config_.topology.rank << " of "
                   << config_.topology.size << " (" << config_.topology.source << "), "
                   << transport_->name() << " transport";
}

Runtime::~Runtime() { shutdown(); }

std::string Runtime::transportName() const { return transport_ ? transport_->name() : ""; }

void Runtime::shutdown() {
  std::call_once(shutdown_once_, [this] {
    {
      std::lock_guard<std::mutex> lock(wake_mu_);
      shutdown_requested_ = true;
    }
    wake_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    handles_.failAll(Status(StatusCode::kAborted, "Tutti was shut down"));
    std::lock_guard<std::mutex> lock(sets_mu_);
    sets_.clear();
    transport_.reset();
  });
}

Status Runtime::stoppedStatus() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return stopped_;
}

std::shared_ptr<ProcessSet> Runtime::findSet(int id) const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

std::shared_ptr<ProcessSet> Runtime::createSet(int id, std::vector<int> ranks) {
  auto set = std::make_shared<ProcessSet>(id, std::move(ranks), config_.topology.rank);
  if (set->member()) {
    set->control = transport_->makeControlPlane(set->ranks, id);
    set->backends = makeBackends(*transport_, *set->control, set->ranks, id, config_);
  }
  std::lock_guard<std::mutex> lock(sets_mu_);
  sets_[id] = set;
  return set;
}

Status Runtime::submit(int process_set, std::vector<TensorEntry> entries, Callback callback,
                       Handle* handle) {
  Status stopped = stoppedStatus();
  if (!stopped.ok()) return stopped;
  auto set = findSet(process_set);
  if (!set)
    return Status(StatusCode::kInvalidArgument,
                  "process set " + std::to_string(process_set) + " does not exist");
  if (!set->member())
    return Status(StatusCode::kInvalidArgument,
                  std::string(opTypeName(entries[0].request.op)) + " '" + entries[0].request.name +
                      "': rank " + std::to_string(config_.topology.rank) +
                      " is not a member of process set " + std::to_string(process_set) +
                      " (ranks " + joinInts(set->ranks) + ")");
  try {
    for (auto& e : entries) validateEntry(e, set->size());
  } catch (const Error& error) {
    return error.status();
  }
  auto state = handles_.create(static_cast<int>(entries.size()), std::move(callback));
  if (entries.size() > 1) {
    for (auto& e : entries) {
      e.request.group = "group." + std::to_string(state->id) + "." + entries[0].request.name;
      e.request.group_size = static_cast<int32_t>(entries.size());
    }
  }
  for (auto& e : entries) e.handle = state;
  Status added = set->queue.add(entries);
  if (!added.ok()) {
    handles_.release(state->id);
    return added;
  }
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    work_pending_ = true;
  }
  wake_cv_.notify_one();
  *handle = state->id;
  return Status::OK();
}

Status Runtime::poll(Handle handle, bool* done) {
  auto state = handles_.find(handle);
  if (!state) return Status(StatusCode::kInvalidArgument, "unknown handle " + std::to_string(handle));
  std::lock_guard<std::mutex> lock(state->mu);
  *done = state->done;
  return Status::OK();
}

Status Runtime::wait(Handle handle, double timeout_seconds, Result* result) {
  auto state = handles_.find(handle);
  if (!state) return Status(StatusCode::kInvalidArgument, "unknown handle " + std::to_string(handle));
  double limit = timeout_seconds < 0 ? config_.timeout_seconds : timeout_seconds;
  Status status = HandleTable::wait(*state, deadlineAfter(limit));
  if (status.code() == StatusCode::kInProgress) {
    if (timeout_seconds < 0)
      return Status(StatusCode::kTimeout, "handle " + std::to_string(handle) +
                                              ": not finished after TUTTI_TIMEOUT_SECONDS=" +
                                              std::to_string(config_.timeout_seconds));
    return status;
  }
  if (result) *result = std::move(state->result);
  handles_.release(handle);
  return status;
}

Status Runtime::addProcessSet(std::vector<int> ranks, int* id) {
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= config_.topology.size || (i && ranks[i] == ranks[i - 1]))
      return Status(StatusCode::kInvalidArgument,
                    "add_process_set: ranks [" + joinInts(ranks) + "] must be distinct ranks in [0, " +
                        std::to_string(config_.topology.size) + ")");
  }
  if (ranks.empty()) return Status(StatusCode::kInvalidArgument, "add_process_set: no ranks given");
  TensorEntry e;
  e.request.op = OpType::kAddProcessSet;
  e.request.splits.assign(ranks.begin(), ranks.end());
  Handle handle = 0;
  std::vector<TensorEntry> entries(1, std::move(e));
  Status s = submit(0, std::move(entries), nullptr, &handle);
  if (!s.ok()) return s;
  auto state = handles_.find(handle);
  s = wait(handle, -1, nullptr);
  if (s.ok()) *id = state->value;
  return s;
}

Status Runtime::removeProcessSet(int id) {
  if (id == 0) return Status(StatusCode::kInvalidArgument, "remove_process_set: the global process set 0 cannot be removed");
  if (!findSet(id)) return Status(StatusCode::kInvalidArgument, "remove_process_set: process set " + std::to_string(id) + " does not exist");
  TensorEntry e;
  e.request.op = OpType::kRemoveProcessSet;
  e.request.root = id;
  Handle handle = 0;
  std::vector<TensorEntry> entries(1, std::move(e));
  Status s = submit(0, std::move(entries), nullptr, &handle);
  return s.ok() ? wait(handle, -1, nullptr) : s;
}

std::vector<int> Runtime::processSetRanks(int id) const {
  auto set = findSet(id);
  return set ? set->ranks : std::vector<int>();
}

int Runtime::processSetRank(int id) const {
  auto set = findSet(id);
  return set ? set->rank : -1;
}

bool Runtime::busy() const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  for (const auto& kv : sets_)
    if (kv.second->member() && kv.second->queue.inFlight() > 0) return true;
  return false;
}

void Runtime::loop() {
  const auto base = std::chrono::duration<double, std::milli>(std::max(config_.cycle_time_ms, 0.05));
  auto idle = base;
  bool had_work = false;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(wake_mu_);
      if (!work_pending_ && !shutdown_requested_ && !(had_work && busy())) {
        auto wait_for = busy() ? base : idle;
        wake_cv_.wait_for(lock, wait_for, [this] { return work_pending_ || shutdown_requested_; });
      }
      work_pending_ = false;
    }
    try {
      if (!runRound(&had_work)) return;
    } catch (const Error& error) {
      stop(error.status());
      return;
    } catch (const std::exception& error) {
      stop(Status(StatusCode::kInternal, error.what()));
      return;
    }
    idle = had_work ? base : std::min(idle * 2, base * 32);
  }
}

bool Runtime::runRound(bool* had_work) {
  std::vector<std::shared_ptr<ProcessSet>> sets;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& kv : sets_) sets.push_back(kv.second);
  }
  bool shutting_down;
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    shutting_down = shutdown_requested_;
  }
  // 1-2. Which sets have new work anywhere, and is anyone shutting down?
  std::vector<uint64_t> bits((sets.size() + 1 + 63) / 64, ~uint64_t(0));
  if (shutting_down) clearBit(bits, 0);
  std::vector<std::vector<Request>> mine(sets.size());
  std::vector<bool> stall_fatal(sets.size(), false);
  std::vector<std::string> fatal_message(sets.size());
  for (size_t i = 0; i < sets.size(); ++i) {
    if (!sets[i]->member()) continue;
    mine[i] = sets[i]->queue.popNew();
    if (sets[i]->rank == 0) fatal_message[i] = checkStalls(*sets[i]);
    stall_fatal[i] = !fatal_message[i].empty();
    if (!mine[i].empty() || stall_fatal[i]) clearBit(bits, 1 + i);
  }
  sets[0]->control->allreduceAnd(bits, deadlineAfter(config_.timeout_seconds));

  // 3-4. Negotiate and execute, set by set in id order.
  *had_work = false;
  for (size_t i = 0; i < sets.size(); ++i) {
    ProcessSet& set = *sets[i];
    if (!set.member() || bitSet(bits, 1 + i)) continue;
    *had_work = true;
    std::vector<Response> responses;
    std::string fatal = fatal_message[i];
    negotiate(set, std::move(mine[i]), stall_fatal[i], &responses, &fatal);
    if (!fatal.empty()) throwError(StatusCode::kTimeout, fatal);
    for (const auto& response : planFusion(std::move(responses), config_.fusion_threshold)) {
      if (response.op == OpType::kAddProcessSet || response.op == OpType::kRemoveProcessSet)
        applySetChange(response);
      else
        executor_.run(response, set);
    }
  }
  // 5. Shutdown: every rank learns it in the same round.
  if (!bitSet(bits, 0)) {
    stop(Status(StatusCode::kAborted,
                shutting_down ? "Tutti was shut down"
                              : "Tutti was shut down: another rank called shutdown"));
    return false;
  }
  return true;
}

void Runtime::negotiate(ProcessSet& set, std::vector<Request> mine, bool stall_fatal_root,
                        std::vector<Response>* responses, std::string* fatal) {
  RequestList list;
  list.requests = std::move(mine);
  Deadline deadline = deadlineAfter(config_.timeout_seconds);
  std::vector<std::string> gathered = set.control->gather(serialize(list), deadline);
  std::string answer;
  if (set.rank == 0) {
    auto now = Clock::now();
    for (int r = 0; r < set.size(); ++r)
      set.coordinator.addRequests(r, parseRequestList(gathered[r]).requests, now);
    ResponseList out;
    out.responses = set.coordinator.takeReady();
    if (stall_fatal_root) out.fatal_error = *fatal;
    answer = serialize(out);
  }
  ResponseList in = parseResponseList(set.control->broadcast(answer, deadline));
  *fatal = in.fatal_error;
  *responses = std::move(in.responses);
}

std::string Runtime::checkStalls(ProcessSet& set) {
  if (config_.stall_check_disable || !set.coordinator.hasPending()) return "";
  double warn_after = config_.stall_check_seconds;
  double stop_after = config_.stall_shutdown_seconds;
  auto now = Clock::now();
  for (const auto& stall : set.coordinator.stalled(now, warn_after)) {
    std::string what = std::string(opTypeName(stall.op)) + " '" + stall.name +
                       "' (process set " + std::to_string(set.id) + ") has waited " +
                       std::to_string(static_cast<int>(stall.waited_seconds)) +
                       " s for rank(s) " + joinInts(stall.missing_ranks);
    if (stop_after > 0 && stall.waited_seconds >= stop_after)
      return "stall shutdown: " + what + " (TUTTI_STALL_SHUTDOWN_TIME_SECONDS=" +
             std::to_string(stop_after) + ")";
    auto& warned = stall_warned_[stall.name];
    if (now - warned >= std::chrono::duration<double>(warn_after)) {
      warned = now;
      TUTTI_LOG(kWarning) << "stall: " << what
                          << "; those ranks have not submitted it (different names, order of "
                             "ops, or a rank stopped early?)";
    }
  }
  return "";
}

void Runtime::applySetChange(const Response& response) {
  auto global = findSet(0);
  auto entry = global->queue.take(response.names[0]);
  Status status;
  if (response.type == ResponseType::kError) {
    status = Status(response.error_code, response.error_message);
  } else if (response.op == OpType::kAddProcessSet) {
    int id = next_set_id_++;
    createSet(id, std::vector<int>(response.splits.begin(), response.splits.end()));
    if (entry) entry->handle->value = id;
  } else {
    std::shared_ptr<ProcessSet> removed;
    {
      std::lock_guard<std::mutex> lock(sets_mu_);
      auto it = sets_.find(response.value);
      if (it != sets_.end()) {
        removed = it->second;
        sets_.erase(it);
      }
    }
    if (removed)
      for (auto& e : removed->queue.takeAll())
        HandleTable::complete(*e.handle, Status(StatusCode::kAborted,
                                                "process set " + std::to_string(removed->id) + " was removed"));
  }
  if (entry) HandleTable::complete(*entry->handle, status);
}

void Runtime::stop(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(status_mu_);
    if (stopped_.ok()) stopped_ = status;
  }
  running_ = false;
  if (status.code() != StatusCode::kAborted)
    TUTTI_LOG(kError) << "background thread stopped: " << status.message();
  std::vector<std::shared_ptr<ProcessSet>> sets;
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    for (auto& kv : sets_) sets.push_back(kv.second);
  }
  for (auto& set : sets) {
    if (status.code() != StatusCode::kAborted && set->member()) {
      set->control->abort(status.message());
      for (auto& b : set->backends) b->abort(status.message());
    }
    for (auto& e : set->queue.takeAll()) HandleTable::complete(*e.handle, status);
  }
  handles_.failAll(status);
}

}  // namespace tutti
