// Recycled memory for the per-op objects of the submit path (handles, and the map nodes of
// handles and queue entries: SpareNodes): a block freed goes
// back to its pool and the next op takes it, so a training loop's steady state makes no
// heap allocation for them. Thread-safe. PoolAllocator holds the pool by shared_ptr, so
// the pool lives as long as any block allocated from it (a handle may outlive its table).
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace tutti {

class BlockPool {
 public:
  // Keeps up to `keep` free blocks of each of a few sizes (up to kMaxBlock bytes).
  explicit BlockPool(size_t keep) : keep_(keep) {}
  ~BlockPool() {
    for (auto& c : classes_)
      for (void* p : c.free) ::operator delete(p);
  }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  void* get(size_t bytes) {
    if (bytes <= kMaxBlock) {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& c : classes_)
        if (c.bytes == bytes && !c.free.empty()) {
          void* p = c.free.back();
          c.free.pop_back();
          return p;
        }
    }
    return ::operator new(bytes);
  }
  void put(void* p, size_t bytes) {
    if (bytes <= kMaxBlock) {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& c : classes_) {
        if (c.bytes == 0) c.bytes = bytes;  // a size not seen before takes a free class
        if (c.bytes != bytes) continue;
        if (c.free.size() >= keep_) break;
        c.free.push_back(p);
        return;
      }
    }
    ::operator delete(p);
  }

  static constexpr size_t kMaxBlock = 1024;

 private:
  struct SizeClass {
    size_t bytes = 0;  // 0: unused
    std::vector<void*> free;
  };
  std::mutex mu_;
  size_t keep_;
  std::array<SizeClass, 4> classes_;
};

// The nodes of entries taken out of an unordered map (`keep` at most), reused by the next
// insertions: no allocation for the node, and a string key keeps its storage (so does a
// value filled in place: insertWith). Not thread-safe: used under its map's lock.
template <typename Map>
class SpareNodes {
 public:
  explicit SpareNodes(size_t keep) : keep_(keep) {}

  template <typename Key, typename Value>
  typename Map::iterator insert(Map& map, Key&& key, Value&& value) {
    if (spare_.empty()) return map.emplace(std::forward<Key>(key), std::forward<Value>(value)).first;
    typename Map::node_type node = std::move(spare_.back());
    spare_.pop_back();
    node.key() = std::forward<Key>(key);
    node.mapped() = std::forward<Value>(value);
    return map.insert(std::move(node)).position;
  }
  // insert() whose value is filled in place by fill(mapped): a reused node's value is the
  // one it held (its strings and vectors keep their storage for fill to assign into).
  template <typename Key, typename Fill>
  typename Map::iterator insertWith(Map& map, Key&& key, Fill fill) {
    typename Map::iterator it;
    if (spare_.empty()) {
      it = map.emplace(std::forward<Key>(key), typename Map::mapped_type()).first;
    } else {
      typename Map::node_type node = std::move(spare_.back());
      spare_.pop_back();
      node.key() = std::forward<Key>(key);
      it = map.insert(std::move(node)).position;
    }
    fill(it->second);
    return it;
  }
  // Takes the entry at `it` out of `map`: returns its value and keeps its node.
  typename Map::mapped_type take(Map& map, typename Map::iterator it) {
    typename Map::node_type node = map.extract(it);
    typename Map::mapped_type value = std::move(node.mapped());
    give(std::move(node));
    return value;
  }
  // A node taken out of its map by its user (map.extract), given back for reuse.
  void give(typename Map::node_type node) {
    if (!node.empty() && spare_.size() < keep_) spare_.push_back(std::move(node));
  }

 private:
  size_t keep_;
  std::vector<typename Map::node_type> spare_;
};

template <typename T>
struct PoolAllocator {
  using value_type = T;
  std::shared_ptr<BlockPool> pool;

  explicit PoolAllocator(std::shared_ptr<BlockPool> p) : pool(std::move(p)) {}
  template <typename U>
  PoolAllocator(const PoolAllocator<U>& other) : pool(other.pool) {}
  T* allocate(size_t n) { return static_cast<T*>(pool->get(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { pool->put(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const PoolAllocator<U>& other) const { return pool == other.pool; }
  template <typename U>
  bool operator!=(const PoolAllocator<U>& other) const { return pool != other.pool; }
};

}  // namespace tutti
