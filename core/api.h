// The runtime behind the C API (core/c_api.cc): holds the one Runtime and turns calls into
// queue entries. Internal: programs reach it through tutti.h (and the header-only tutti.hpp
// over it), so that only C symbols cross libtutti's boundary.
#pragma once

#include "backends/options.h"
#include "base/common.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tutti {
namespace api {

Status init();
// init with the rank and size given, connecting through the program's store
// (tutti_init_with_store).
Status initWithStore(int rank, int size, std::shared_ptr<KeyValueStore> store);
Status shutdown();
bool isInitialized();
int rank();
int size();
int localRank();
int localSize();
int crossRank();
int crossSize();

// The tensors' device is each view's device.type (the C API sets it from its options).
Status allreduceAsync(const std::string& name, const TensorView& input, const TensorView& output,
                      const OpOptions& options, Handle* handle);
Status groupedAllreduceAsync(const std::vector<std::string>& names,
                             const std::vector<TensorView>& inputs,
                             const std::vector<TensorView>& outputs, const OpOptions& options,
                             Handle* handle);
Status broadcastAsync(const std::string& name, const TensorView& buffer, const OpOptions& options,
                      Handle* handle);
Status allgatherAsync(const std::string& name, const TensorView& input, const OpOptions& options,
                      Handle* handle);
Status alltoallAsync(const std::string& name, const TensorView& input, const OpOptions& options,
                     Handle* handle);
Status reducescatterAsync(const std::string& name, const TensorView& input,
                          const OpOptions& options, Handle* handle);
Status barrierAsync(int process_set, Handle* handle);
Status joinAsync(int process_set, Handle* handle);

Status poll(Handle handle, bool* done);
// *from_allocator (when not null): the output came from the op's allocator, not malloc.
Status wait(Handle handle, double timeout_seconds, Result* result, bool* from_allocator = nullptr);

Status addProcessSet(const std::vector<int>& ranks, int* process_set);
Status removeProcessSet(int process_set);
int processSetRank(int process_set);
int processSetSize(int process_set);
std::vector<int> processSetRanks(int process_set);

Status startTimeline(const std::string& path, bool mark_cycles);
Status stopTimeline();
std::vector<std::pair<std::string, int64_t>> stats();

bool isRecoverable(StatusCode code);  // core/elastic_api.cc
Status hostsUpdated(bool* updated);
bool backendBuilt(const std::string& name);
std::string cpuBackend();

}  // namespace api
}  // namespace tutti
