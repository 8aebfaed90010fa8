// tutti_init_with_store (tutti.h): Tutti started from the program's key-value store, with the
// rank and size the program gives. The C callbacks become the KeyValueStore the gloo
// transport connects through (backends/options.h).
#include "backends/options.h"
#include "base/common.h"
#include "core/api.h"
#include "core/c_api_util.h"

#include <tutti/tutti.h>

#include <cstdlib>
#include <memory>
#include <string>

namespace {

using tutti::capi::guarded;
using tutti::capi::invalid;

class CallbackStore : public tutti::KeyValueStore {
 public:
  explicit CallbackStore(const tutti_store_t& store)
      : store_(store),
        description_(store.description && *store.description
                         ? std::string("the caller's store (") + store.description + ")"
                         : std::string("the caller's store")) {
    store_.description = nullptr;  // not ours to keep
  }

  void set(const std::string& key, const std::string& value) override {
    const int rc = store_.set(key.c_str(), value.data(), value.size(), store_.user_data);
    if (rc != 0)
      tutti::throwError(tutti::StatusCode::kBackend,
                        describe() + ": setting key '" + key + "' failed (set returned " +
                            std::to_string(rc) + ")");
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    void* data = nullptr;
    size_t nbytes = 0;
    const double seconds = static_cast<double>(timeout.count()) / 1000.0;
    const int rc = store_.get(key.c_str(), seconds, &data, &nbytes, store_.user_data);
    std::unique_ptr<void, void (*)(void*)> owned(data, std::free);
    if (rc == 1)
      tutti::throwError(tutti::StatusCode::kTimeout,
                        describe() + ": key '" + key + "' did not arrive within " +
                            tutti::secondsText(seconds) +
                            " s (TUTTI_START_TIMEOUT_SECONDS): a rank of the job has not "
                            "reached init, or uses another store");
    if (rc != 0)
      tutti::throwError(tutti::StatusCode::kBackend,
                        describe() + ": getting key '" + key + "' failed (get returned " +
                            std::to_string(rc) + ")");
    if (nbytes > 0 && data == nullptr)
      tutti::throwError(tutti::StatusCode::kBackend,
                        describe() + ": get of key '" + key + "' returned " +
                            std::to_string(nbytes) + " bytes but no data");
    return nbytes ? std::string(static_cast<const char*>(data), nbytes) : std::string();
  }

  std::string describe() const override { return description_; }

 private:
  tutti_store_t store_;
  const std::string description_;
};

}  // namespace

extern "C" tutti_status_t tutti_init_with_store(int rank, int size, const tutti_store_t* store) {
  if (store == nullptr) return invalid("tutti_init_with_store: store pointer is null");
  if (store->struct_size != sizeof(tutti_store_t))
    return invalid("tutti_init_with_store: store struct_size is " +
                   std::to_string(store->struct_size) + ", expected sizeof(tutti_store_t) = " +
                   std::to_string(sizeof(tutti_store_t)));
  if (store->set == nullptr || store->get == nullptr)
    return invalid(std::string("tutti_init_with_store: the store's ") +
                   (store->set == nullptr ? "set" : "get") + " function is null");
  if (size < 1 || rank < 0 || rank >= size)
    return invalid("tutti_init_with_store: rank " + std::to_string(rank) + " of size " +
                   std::to_string(size) + ": expected a size >= 1 and a rank in [0, size)");
  return guarded([&] {
    return tutti::api::initWithStore(rank, size, std::make_shared<CallbackStore>(*store));
  });
}
