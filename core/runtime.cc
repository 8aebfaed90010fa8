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
    : config_(std::move(config)),
      transport_(std::move(transport)),
      timeline_(config_.timeline_filename.empty()
                    ? nullptr
                    : std::make_unique<Timeline>(config_.timeline_filename, config_.topology.rank,
                                                 config_.topology.size)),
      executor_(config_, timeline_.get()) {
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
  auto set = std::make_shared<ProcessSet>(id, std::move(ranks), config_.topology.rank,
                                          config_.cache_capacity);
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
      // The same on every rank: no two groups in flight share a first name.
      e.request.group = entries[0].request.name + "/" + std::to_string(entries.size());
      e.request.group_size = static_cast<int32_t>(entries.size());
    }
  }
  for (auto& e : entries) e.handle = state;
  std::vector<std::string> names;
  Status added = set->queue.add(entries, timeline_ ? &names : nullptr);
  if (!added.ok()) {
    handles_.release(state->id);
    return added;
  }
  if (timeline_)
    for (const auto& name : names) timeline_->begin(name, "NEGOTIATE");
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
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= config_.topology.size || (i && ranks[i] <= ranks[i - 1]))
      return Status(StatusCode::kInvalidArgument,
                    "add_process_set: expected sorted, distinct ranks in [0, " +
                        std::to_string(config_.topology.size) + "), got [" + joinInts(ranks) + "]");
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

namespace {

// Where a set's bits sit in the round's AND-allreduce: bit 0 "not shutting down", then per
// set "no new requests" and "nobody joined", then per set one word-aligned section with a
// bit per cache slot ("I submitted this cached op").
struct BitLayout {
  BitLayout(size_t nsets, int64_t capacity) : sets(nsets) {
    size_t header = 1 + 2 * nsets;
    size_t words = (header + 63) / 64;
    section_words = static_cast<size_t>((capacity + 63) / 64);
    for (size_t i = 0; i < nsets; ++i) section.push_back((words + i * section_words) * 64);
    total_words = words + nsets * section_words;
  }
  size_t noNew(size_t set) const { return 1 + 2 * set; }
  size_t noJoin(size_t set) const { return 2 + 2 * set; }
  size_t slot(size_t set, int slot) const { return section[set] + static_cast<size_t>(slot); }
  size_t sets, section_words, total_words;
  std::vector<size_t> section;
};

void setBit(std::vector<uint64_t>& bits, size_t i) { bits[i / 64] |= uint64_t(1) << (i % 64); }

}  // namespace

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
  // 1-2. Sort this rank's new requests into cache hits and misses; build the bit vector.
  BitLayout layout(sets.size(), config_.cache_capacity);
  std::vector<uint64_t> bits(layout.total_words, ~uint64_t(0));
  if (shutting_down) clearBit(bits, 0);
  struct Mine {
    std::vector<Request> misses;
    std::vector<std::pair<int, Request>> hits;
    std::string fatal;
  };
  std::vector<Mine> mine(sets.size());
  for (size_t i = 0; i < sets.size(); ++i) {
    ProcessSet& set = *sets[i];
    if (!set.member()) continue;
    Mine& m = mine[i];
    m.misses.swap(set.demoted);
    for (auto& q : set.queue.popNew()) {
      if (q.op == OpType::kJoin) set.joined = true;
      int slot = set.cache.lookup(q);
      if (slot >= 0)
        m.hits.emplace_back(slot, std::move(q));
      else
        m.misses.push_back(std::move(q));
    }
    if (set.rank == 0) m.fatal = checkStalls(set);
    if (!m.misses.empty() || !m.fatal.empty()) clearBit(bits, layout.noNew(i));
    if (set.joined) clearBit(bits, layout.noJoin(i));
    for (size_t w = 0; w < layout.section_words; ++w) bits[layout.section[i] / 64 + w] = 0;
    for (const auto& hit : m.hits) setBit(bits, layout.slot(i, hit.first));
  }
  sets[0]->control->allreduceAnd(bits, deadlineAfter(config_.timeout_seconds));

  // 3-4. Cached ops every member submitted, then negotiation, then execution, set by set.
  *had_work = false;
  for (size_t i = 0; i < sets.size(); ++i) {
    ProcessSet& set = *sets[i];
    if (!set.member()) continue;
    Mine& m = mine[i];
    const bool someone_joined = !bitSet(bits, layout.noJoin(i));
    std::vector<Response> responses;
    std::vector<int> hit_slots;
    if (someone_joined) {  // the coordinator must see every request while a rank is joined
      for (auto& hit : m.hits) m.misses.push_back(std::move(hit.second));
    } else {
      for (int slot = 0; slot < set.cache.capacity(); ++slot)
        if (bitSet(bits, layout.slot(i, slot))) hit_slots.push_back(slot);
      for (auto& hit : m.hits)
        if (!bitSet(bits, layout.slot(i, hit.first))) set.demoted.push_back(std::move(hit.second));
      for (int slot : hit_slots) responses.push_back(set.cache.response(slot));
    }
    const bool negotiates = !bitSet(bits, layout.noNew(i)) || someone_joined;
    if (!negotiates && hit_slots.empty()) continue;
    *had_work = true;
    size_t first_negotiated = responses.size();
    if (negotiates) {
      std::string fatal = m.fatal;
      negotiate(set, std::move(m.misses), !m.fatal.empty(), &responses, &fatal);
      if (!fatal.empty()) throwError(StatusCode::kTimeout, fatal);
    }
    // The cache learns this round's new agreements, in agreed order, before execution
    // takes the entries (every member holds an identical request for each of them).
    if (!someone_joined) {
      for (int slot : hit_slots) set.cache.touch(slot);
      for (size_t k = first_negotiated; k < responses.size(); ++k) {
        const Response& r = responses[k];
        if (r.type != ResponseType::kOp || r.names.size() != 1) continue;
        if (auto q = set.queue.peek(r.names[0])) set.cache.put(*q, r);
      }
    }
    for (const auto& response : planFusion(std::move(responses), config_.fusion_threshold)) {
      if (response.op == OpType::kAddProcessSet || response.op == OpType::kRemoveProcessSet)
        applySetChange(response);
      else
        executor_.run(response, set);
      if (response.op == OpType::kJoin) set.joined = false;
    }
  }
  for (auto& set : sets)
    if (set->member() && !set->demoted.empty()) *had_work = true;  // negotiate them at once
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
  for (auto& r : in.responses) responses->push_back(std::move(r));
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
