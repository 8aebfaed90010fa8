// The tensors this rank has submitted to one process set and not yet finished.
// Thread-safe: API threads add, the background thread pops new requests and takes entries
// to execute them.
#pragma once

#include "core/block_pool.h"
#include "core/handle_table.h"
#include "core/message.h"

#include <map>
#include <unordered_map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tutti {

struct TensorEntry {
  Request request;
  const void* input = nullptr;
  void* output = nullptr;
  OutputAllocator allocator;  // allgather/alltoall/reducescatter output; malloc when empty
  std::shared_ptr<HandleState> handle;
};

class TensorQueue {
  struct Queued {
    TensorEntry entry;
    bool unpopped = false;  // its request waits in new_ for popNew()
    bool claimed = false;   // an agreed error names it (claim())
  };
  using Map = std::unordered_map<std::string, Queued>;

 public:
  // An entry taken out of the queue to run (take()), in its own map node: empty where the
  // name was not in the queue (a joined rank holds no such tensor). Given back with
  // recycle() once run, so that the next entry added reuses its storage.
  class Taken {
   public:
    explicit operator bool() const { return !node_.empty(); }
    TensorEntry& operator*() { return node_.mapped().entry; }
    TensorEntry* operator->() { return &node_.mapped().entry; }
    const TensorEntry& operator*() const { return node_.mapped().entry; }
    const TensorEntry* operator->() const { return &node_.mapped().entry; }

   private:
    friend class TensorQueue;
    Map::node_type node_;
  };

  // Adds the `count` entries at `entries`, all or none: kDuplicateName if a name is already
  // in flight here (or twice among them). Empty names get "<op>.noname.<n>" (in the given
  // entry too). Each request is copied, into the storage of a recycled entry where there is
  // one (no allocation once warm); the rest of the entry is moved from. `names` (if given)
  // receives their final names.
  Status add(TensorEntry* entries, size_t count, std::vector<std::string>* names = nullptr);
  Status add(std::vector<TensorEntry>& entries, std::vector<std::string>* names = nullptr) {
    return add(entries.data(), entries.size(), names);
  }
  // The requests added since the last call, in submission order, into *out (its previous
  // contents dropped; both lists keep their storage, so a steady state allocates nothing).
  // They point into their entries, read in place: each stays valid until its entry is
  // taken (take(), takeAll()). An entry taken before its request was popped (an error
  // agreed from the other ranks' requests while this rank's was on its way) leaves the
  // new requests: it is never handed out.
  void popNew(std::vector<const Request*>* out);
  std::optional<TensorEntry> take(const std::string& name);
  // The entries of `names`, in order, under one lock (a fused batch), into *out (its
  // previous contents, recycled or not, dropped). With `claimed_only`, only those claim()
  // marked: the others stay (an empty Taken in their place).
  void take(const std::vector<std::string>& names, std::vector<Taken>* out,
            bool claimed_only = false);
  // Marks the entries of `names` that are here now as those an agreed error completes, and
  // takes their requests out of the new ones (the background thread, when it agrees on the
  // error; the error may run later, on the stream's thread). An entry of the same name added
  // after this is not the error's: it is negotiated on its own.
  void claim(const std::vector<std::string>& names);
  // Gives the entries of a batch back once run, and clears *taken: their handles and
  // allocators are released here, their requests' storage kept for the next entries.
  void recycle(std::vector<Taken>* taken);
  std::optional<Request> peek(const std::string& name) const;
  size_t inFlight() const;
  // Removes every entry; their handles are the caller's to complete.
  std::vector<TensorEntry> takeAll();

 private:
  mutable std::mutex mu_;
  Map entries_;
  // Pooled: the nodes of taken entries (their name's storage, and a recycled entry's
  // request's) are reused by the next ones added (kSpareNodes at most).
  static constexpr size_t kSpareNodes = 4096;
  SpareNodes<Map> nodes_{kSpareNodes};
  // The entries added since popNew, in submission order (each marked unpopped; one taken
  // before it is popped leaves this list, so these never dangle).
  std::vector<Queued*> new_;
  void forgetNew(Queued& q);  // mu_ held; clears q's unpopped mark
  std::map<int, int64_t> noname_counters_;  // per OpType
};

}  // namespace tutti
