#include "core/negotiator.h"

#include "core/fusion.h"

#include <algorithm>

namespace tutti {
namespace {

// A hit that waits this long goes to full negotiation, where rank 0's stall inspector sees
// it (a hit alone is invisible to the coordinator).
constexpr std::chrono::seconds kHitPatience(1);

}  // namespace

template <typename Parse>
auto Negotiator::fromPeer(int rank, const char* who, Parse parse) const -> decltype(parse()) {
  try {
    return parse();
  } catch (const Error& e) {
    throwError(e.code(), "process set " + std::to_string(id_) + ": from rank " +
                             std::to_string(rank) + " (" + who + "): " + e.what());
  }
}

RoundBits::RoundBits(size_t nsets, int64_t cache_capacity)
    : capacity_(cache_capacity),
      nsets_(nsets),
      head_words_((1 + 2 * nsets + 63) / 64),
      section_words_(static_cast<size_t>((cache_capacity + 63) / 64)),
      words_(head_words_ + nsets * kOrderedWords + 2 * nsets * section_words_, ~uint64_t(0)) {}

void RoundBits::beyondCapacity(size_t set, int slot) const {
  throwError(StatusCode::kInternal,
             "the round's bits of process set index " + std::to_string(set) +
                 " name response cache slot " + std::to_string(slot) + ", beyond its capacity " +
                 std::to_string(capacity_) + " (do the ranks disagree on TUTTI_CACHE_CAPACITY?)");
}

void RoundBits::clearHits(size_t set) {
  for (size_t w = 0; w < section_words_; ++w) words_[hits(set) / 64 + w] = 0;
}

Negotiator::Negotiator(int set_id, int rank, int size, int64_t cache_capacity)
    : id_(set_id), rank_(rank), size_(size), coordinator_(size), cache_(cache_capacity) {}

template <typename Drop>
void Negotiator::dropHits(Requests* out, Drop drop) {
  // In place, order kept: no allocation when nothing is dropped.
  size_t kept = 0;
  for (auto& hit : hits_) {
    if (drop(hit)) {
      if (out) out->push_back(hit.request);
      continue;
    }
    if (&hits_[kept] != &hit) hits_[kept] = std::move(hit);
    ++kept;
  }
  hits_.erase(hits_.begin() + static_cast<std::ptrdiff_t>(kept), hits_.end());
}

void Negotiator::noteDemotedGroup(const std::string& group) {
  if (!group.empty() &&
      std::find(demoted_groups_.begin(), demoted_groups_.end(), group) == demoted_groups_.end())
    demoted_groups_.push_back(group);
}

template <typename Drop>
void Negotiator::dropHitsWithGroups(Requests& out, Drop drop) {
  dropHits(&out, [&](const CacheHit& h) {
    const bool demoted =
        drop(h) || (!h.request->group.empty() &&
                    std::find(demoted_groups_.begin(), demoted_groups_.end(),
                              h.request->group) != demoted_groups_.end());
    if (demoted) demoted_slots_.push_back(h.slot);
    return demoted;
  });
}

template <typename Drop>
void Negotiator::demoteHits(Requests& out, Drop drop) {
  demoted_groups_.clear();
  for (const auto& hit : hits_)
    if (drop(hit)) noteDemotedGroup(hit.request->group);
  dropHitsWithGroups(out, drop);
}

void Negotiator::useCache(bool on) {
  if (on == cache_on_) return;
  cache_on_ = on;
  dropHits(&demoted_, [](const CacheHit&) { return true; });
  cache_.clear();
}

void Negotiator::forget() {
  hits_.clear();
  demoted_.clear();
  misses_.clear();
  demoted_slots_.clear();
  ordered_.clear();
}

bool Negotiator::orderable(const Request& q) const {
  if (!q.ordered || !q.group.empty()) return false;
  switch (q.op) {
    case OpType::kAllreduce:
    case OpType::kBroadcast:
    case OpType::kReducescatter:
      return true;
    case OpType::kAllgather: {  // equal rows everywhere: the output must fit
      if (q.shape.empty()) return false;
      std::vector<int64_t> out = q.shape;
      int64_t bytes = 0;
      return checkedMul(out[0], static_cast<int64_t>(size_), &out[0]) &&
             tensorBytes(out, q.dtype, &bytes);
    }
    default:
      return false;
  }
}

namespace {

template <typename T>
uint64_t fnvValue(uint64_t h, const T& v) {
  return fnv1a(&v, sizeof v, h);
}

}  // namespace

uint64_t Negotiator::orderedHash(const Request& q) {
  uint64_t h = fnvValue(kFnvBasis, static_cast<uint64_t>(q.name.size()));
  h = fnv1a(q.name.data(), q.name.size(), h);
  h = fnvValue(h, static_cast<int32_t>(q.op));
  h = fnvValue(h, static_cast<int32_t>(q.dtype));
  h = fnvValue(h, static_cast<int32_t>(q.reduce_op));
  h = fnvValue(h, static_cast<int32_t>(q.device));
  h = fnvValue(h, q.root);
  h = fnvValue(h, q.prescale);  // as bits: any value (NaN, -0.0) matches only itself
  h = fnvValue(h, q.postscale);
  h = fnvValue(h, static_cast<uint64_t>(q.shape.size()));
  for (int64_t d : q.shape) h = fnvValue(h, d);
  // A final mix, so that every input bit moves every output bit.
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

void Negotiator::contributeOrdered(RoundBits& bits, size_t index, Clock::time_point now) {
  uint64_t* w = bits.ordered(index);
  const size_t held = std::min(ordered_.size(), static_cast<size_t>(RoundBits::kOrderedWindow));
  for (size_t k = held; k < static_cast<size_t>(RoundBits::kOrderedWindow); ++k)
    w[0] &= ~(uint64_t(1) << k);
  if (!ordered_.empty() && now - ordered_since_ > kHitPatience)
    w[0] &= ~(uint64_t(1) << RoundBits::kOrderedWindow);  // send the next one to the coordinator
  for (size_t k = 0; k < held; ++k) {
    const uint64_t h = ordered_[k].hash;
    w[1 + 2 * k] = h;
    w[2 + 2 * k] = ~h;
  }
}

void Negotiator::agreeOrdered(const RoundBits& bits, size_t index, bool someone_joined,
                              std::vector<Response>* agreed) {
  if (ordered_off_) return;
  if (someone_joined) {  // the coordinator must see every request while a rank is joined
    ordered_off_ = true;
    for (const Ordered& o : ordered_) misses_.push_back(o.request);
    ordered_.clear();
    return;
  }
  const uint64_t* w = bits.ordered(index);
  int held = 0;  // positions every member holds
  while (held < RoundBits::kOrderedWindow && ((w[0] >> held) & 1u)) ++held;
  int same = 0;  // of those, positions with the same signature everywhere
  while (same < held && (w[1 + 2 * same] | w[2 + 2 * same]) == ~uint64_t(0)) ++same;
  // Every member holds positions [0, held): none past them on this rank was counted by the
  // others, and this rank holds at least `held` (it set those bits itself).
  for (int k = 0; k < same; ++k) {
    agreed->push_back(orderedResponse(*ordered_.front().request));
    ordered_.pop_front();
  }
  int64_t decided = same;
  const bool differ = same < held;
  const bool impatient = same == 0 && !((w[0] >> RoundBits::kOrderedWindow) & 1u);
  if (differ || impatient) {
    // The next position goes to full negotiation on every member: by name, it meets the
    // other members' requests at the coordinator (which holds a mismatch as an error, or
    // waits for a late rank under its stall checks). A member that has not submitted it yet
    // sends it in full when it comes (its position is below the head by then).
    if (!ordered_.empty()) {
      demoted_.push_back(ordered_.front().request);
      ordered_.pop_front();
    }
    ++decided;
  }
  ordered_head_ += decided;
  if (decided > 0) ordered_since_ = Clock::now();
}

Response Negotiator::orderedResponse(const Request& q) const {
  Response r;
  r.names = {q.name};
  r.op = q.op;
  r.dtype = q.dtype;
  r.reduce_op = q.reduce_op;
  r.device = q.device;
  r.root = q.root;
  r.prescale = q.prescale;
  r.postscale = q.postscale;
  if (q.op == OpType::kAllgather)
    r.first_dims.assign(static_cast<size_t>(size_), q.shape[0]);  // every member's rows
  else
    r.counts = {shapeElements(q.shape)};
  return r;
}

void Negotiator::contribute(const Requests& fresh, std::string stall, RoundBits& bits,
                            size_t index, Timeline* tl, int64_t* hits, int64_t* misses) {
  misses_.clear();
  misses_.swap(demoted_);
  stall_ = std::move(stall);
  const auto now = Clock::now();
  demoted_slots_.clear();
  demoteHits(misses_, [&](const CacheHit& h) { return now - h.since > kHitPatience; });
  hits_.reserve(hits_.size() + fresh.size());
  for (const Request* q : fresh) {
    if (q->op == OpType::kJoin) joined_ = true;
    if (!ordered_off_ && orderable(*q) && ordered_seen_++ >= ordered_head_) {
      if (ordered_.empty()) ordered_since_ = now;
      ordered_.push_back(Ordered{q, orderedHash(*q)});
      if (tl) {
        tl->dequeued(id_, q->op, q->name);
        tl->begin(id_, q->op, q->name, negotiatePhaseName(q->op), "\"ordered\":true");
      }
      continue;
    }
    int stale = -1;
    const int slot = cache_on_ ? cache_.lookup(*q, &stale) : -1;
    (slot >= 0 ? *hits : *misses) += 1;
    if (tl) {
      tl->dequeued(id_, q->op, q->name);
      tl->begin(id_, q->op, q->name, negotiatePhaseName(q->op),
                slot >= 0 ? "\"cache\":\"hit\"" : "");
    }
    if (slot >= 0) {
      hits_.push_back(CacheHit{slot, q, now});
      continue;
    }
    if (stale >= 0) bits.clear(bits.valid(index, stale));
    misses_.push_back(q);
  }
  // A group runs from the cache only if all of it hit: with a miss, its hits go to full
  // negotiation too (the same on every member: their caches and requests are the same).
  demoted_groups_.clear();
  for (const Request* q : misses_) noteDemotedGroup(q->group);
  if (!demoted_groups_.empty())
    dropHitsWithGroups(misses_, [](const CacheHit&) { return false; });
  if (!misses_.empty() || !stall_.empty()) bits.clear(bits.noNew(index));
  if (joined_) bits.clear(bits.noJoin(index));
  bits.clearHits(index);
  for (const auto& hit : hits_) bits.set(bits.hit(index, hit.slot));
  contributeOrdered(bits, index, now);
}

Agreement Negotiator::agree(const RoundBits& bits, size_t index, ControlPlane& control,
                            const TensorQueue& queue, Deadline deadline, Timeline* tl,
                            int64_t fusion_threshold) {
  Agreement out;
  const bool someone_joined = !bits.test(bits.noJoin(index));
  std::vector<int>& ready = ready_;
  ready.clear();
  if (someone_joined) {  // the coordinator must see every request while a rank is joined
    dropHits(&misses_, [](const CacheHit&) { return true; });
  } else {
    // 1. A slot some rank found stale: every member negotiates its waiting hits in full.
    // 2. Cached ops every member holds run now, in slot order.
    bits.scan(
        index, [&](int slot) { ready.push_back(slot); },
        [&](int slot) {
          demoteHits(misses_, [slot](const CacheHit& h) { return h.slot == slot; });
          cache_.erase(slot);
        });
    // A ready slot whose hit went with its group's stale member negotiates in full on every
    // member (the slot's group is the same everywhere).
    if (!demoted_slots_.empty())
      ready.erase(std::remove_if(ready.begin(), ready.end(),
                                 [&](int slot) {
                                   return std::find(demoted_slots_.begin(),
                                                    demoted_slots_.end(),
                                                    slot) != demoted_slots_.end();
                                 }),
                  ready.end());
    // Their entries run from the cached responses.
    dropHits(nullptr, [&](const CacheHit& h) {
      return std::binary_search(ready.begin(), ready.end(), h.slot);
    });
  }
  out.cached = ready.size();
  std::vector<Response> ordered;
  agreeOrdered(bits, index, someone_joined, &ordered);
  out.ordered = ordered.size();
  const bool negotiates = !bits.test(bits.noNew(index)) || someone_joined;
  if (!negotiates && ready.empty() && ordered.empty()) return out;
  out.active = true;
  std::vector<Response> negotiated;
  if (negotiates) {
    const auto start = Clock::now();
    negotiate(control, deadline, tl, &negotiated);
    out.negotiation = Clock::now() - start;
  }
  out.negotiated = negotiated.size();
  // 3. Every negotiated response against this rank's own request: the executor copies as
  //    many elements (rows, splits) as the root agreed.
  for (const Response& r : negotiated) {
    if (r.type != ResponseType::kOp || r.names.size() != 1) continue;
    auto q = queue.peek(r.names[0]);
    if (!q) continue;
    if (r.counts.size() == 1 && r.counts[0] != shapeElements(q->shape))
      throwError(StatusCode::kInternal,
                 fromRoot(r) + ": agreed " + std::to_string(r.counts[0]) +
                     " elements, but this rank's tensor has " +
                     std::to_string(shapeElements(q->shape)) + " (shape " +
                     shapeString(q->shape) + ")");
    const auto me = static_cast<size_t>(rank_);
    if (r.op == OpType::kAllgather && !q->shape.empty() && r.first_dims[me] != q->shape[0])
      throwError(StatusCode::kInternal, fromRoot(r) + ": agreed " +
                                            std::to_string(r.first_dims[me]) +
                                            " rows from this rank, but its tensor has " +
                                            std::to_string(q->shape[0]));
    if (r.op == OpType::kAlltoall && q->splits.size() == static_cast<size_t>(size_) &&
        !std::equal(q->splits.begin(), q->splits.end(),
                    r.splits.begin() + static_cast<std::ptrdiff_t>(me) * size_))
      throwError(StatusCode::kInternal,
                 fromRoot(r) + ": agreed other send splits for this rank than its own");
  }
  // 4. The round's batches, in agreed order (cached ops first, then ordered ones, then
  //    negotiated ones), read straight from the cache's slots: a cached response is copied
  //    once, into its batch, not first into a list of its own.
  std::vector<const Response*> agreed;
  agreed.reserve(ready.size() + ordered.size() + negotiated.size());
  for (int slot : ready) agreed.push_back(&cache_.response(slot));
  for (const Response& r : ordered) agreed.push_back(&r);
  for (const Response& r : negotiated) agreed.push_back(&r);
  out.responses = planFusion(agreed, fusion_threshold);
  // 5. The cache learns this round's agreements, in agreed order, after the batches are
  //    planned (a put may replace a slot read above), before execution takes the entries
  //    (every member holds an identical request for each). A hit still waiting for a slot
  //    that gets replaced is negotiated in full next round.
  if (!someone_joined && cache_on_) {
    for (int slot : ready) cache_.touch(slot);
    for (const Response& r : negotiated) {
      if (r.type != ResponseType::kOp || r.names.size() != 1) continue;
      auto q = queue.peek(r.names[0]);
      if (!q) continue;
      const int replaced = cache_.put(*q, r);
      if (replaced >= 0)
        demoteHits(demoted_, [replaced](const CacheHit& h) { return h.slot == replaced; });
    }
  }
  for (const auto& r : out.responses) {
    if (r.op == OpType::kJoin) joined_ = false;  // it runs this round
    if (tl)  // agreed: each tensor now waits for its fused batch to run
      for (const auto& name : r.names) {
        tl->end(id_, r.op, name);
        tl->begin(id_, r.op, name, "WAIT_FOR_BATCH");
      }
  }
  return out;
}

void Negotiator::negotiate(ControlPlane& control, Deadline deadline, Timeline* tl,
                           std::vector<Response>* responses) {
  // 1. Every member sends its misses to the set's rank 0.
  // 2. Rank 0 adds them to the coordinator's table and broadcasts what became ready (and
  //    its fatal stall verdict, if any); every member appends that to `responses`.
  std::vector<std::string> gathered = control.gather(serializeRequests(misses_), deadline);
  misses_.clear();
  std::string answer;
  if (rank_ == 0) {
    const auto now = Clock::now();
    std::vector<Request> arrived;
    for (int r = 0; r < static_cast<int>(gathered.size()); ++r) {
      auto requests =
          fromPeer(r, "a member", [&] { return parseRequestList(gathered[r]); }).requests;
      coordinator_.addRequests(r, requests, now);
      if (tl)
        for (auto& q : requests) {
          tl->instant(id_, q.op, q.name, "REQUEST", "\"rank\":" + std::to_string(r));
          arrived.push_back(std::move(q));
        }
    }
    if (tl) markMissing(arrived, now, tl);
    ResponseList out;
    out.responses = coordinator_.takeReady();
    out.fatal_error = stall_;
    answer = serialize(out);
  }
  const std::string agreed = control.broadcast(answer, deadline);
  ResponseList in = fromPeer(0, "the set's root", [&] {
    ResponseList list = parseResponseList(agreed);
    for (const auto& r : list.responses) checkResponseForSet(r, size_);
    return list;
  });
  if (!in.fatal_error.empty()) throwError(StatusCode::kTimeout, in.fatal_error);
  for (auto& r : in.responses) responses->push_back(std::move(r));
}

std::string Negotiator::fromRoot(const Response& r) const {
  return "process set " + std::to_string(id_) + ": from rank 0 (the set's root): " +
         opTypeName(r.op) + " " + quotedName(r.names[0]);
}

void Negotiator::markMissing(const std::vector<Request>& arrived, Clock::time_point now,
                             Timeline* tl) {
  // Rank 0 of the set: each tensor that got requests this round but still waits for some
  // ranks shows which, on its row.
  for (const auto& stall : coordinator_.stalled(now, 0)) {
    auto it = std::find_if(arrived.begin(), arrived.end(),
                           [&](const Request& q) { return q.name == stall.name; });
    if (it == arrived.end()) continue;
    std::string missing;
    for (int r : stall.missing_ranks) missing += (missing.empty() ? "" : ",") + std::to_string(r);
    tl->instant(id_, it->op, it->name, "WAITING_FOR_RANKS", "\"missing\":[" + missing + "]");
  }
}

}  // namespace tutti
