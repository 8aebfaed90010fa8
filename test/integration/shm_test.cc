// The shm backend in real processes on one host (under mpirun and tuttirun --gloo): it is
// in use (its segment mapped, its name already gone from /dev/shm) unless TUTTI_SHM=0,
// allreduce from 0 elements to 64 MiB with odd counts, in and out of place, and two
// subset process sets moving large tensors at once. The op × dtype × reduce-op sweep is in
// the other integ_* binaries, which run on shm as well.
#include "test/integration/test_util.h"

#include "test/catch.h"

#include <cstdlib>
#include <fstream>
#include <string>

using namespace tutti;
using namespace tutti::itest;

namespace {

// The lines of /proc/self/maps that map a Tutti shm segment.
std::vector<std::string> shmMappings() {
  std::vector<std::string> found;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("/dev/shm/tutti-") != std::string::npos) found.push_back(line);
  return found;
}

bool shmDisabled() {
  const char* v = std::getenv("TUTTI_SHM");
  return v != nullptr && std::string(v) == "0";
}

// x_r[i] = r + 1 + (i % 13): every partial sum is an exact integer in float32 and bfloat16
// up to 4 ranks (at most 4 * 17 = 68).
double valueAt(int r, int64_t i) { return r + 1 + static_cast<double>(i % 13); }

void checkAllreduce(DataType dtype, int64_t count, bool in_place) {
  const int n = size(), me = rank();
  HostTensor in(dtype, {count}), out(dtype, {count});
  for (int64_t i = 0; i < count; ++i) in.set(i, valueAt(me, i));
  out.fill(-1);
  HostTensor& dst = in_place ? in : out;
  Handle h = 0;
  const std::string name = "shm.allreduce." + std::to_string(static_cast<int>(dtype)) + "." +
                           std::to_string(count) + (in_place ? ".inplace" : "");
  REQUIRE(allreduceAsync(name, in.view(), dst.view(), OpOptions(), &h).ok());
  Status s = waitFor(h);
  INFO(name << ": " << describe(s));
  REQUIRE(s.ok());
  int64_t bad = -1;
  for (int64_t i = 0; i < count && bad < 0; ++i) {
    double expected = 0;
    for (int r = 0; r < n; ++r) expected += valueAt(r, i);
    if (dst.get(i) != expected) bad = i;
  }
  INFO("first wrong element " << bad);
  CHECK(bad < 0);
}

}  // namespace

TEST_CASE("shm is in use on one host unless TUTTI_SHM=0, and its name is already unlinked") {
  requireInit();
  auto maps = shmMappings();
  if (size() == 1 || shmDisabled()) {
    CHECK(maps.empty());
    return;
  }
  REQUIRE_FALSE(maps.empty());
  for (const auto& line : maps) {
    INFO(line);
    CHECK(line.find("(deleted)") != std::string::npos);
  }
}

TEST_CASE("shm allreduce from 0 elements to 64 MiB, odd counts, in and out of place") {
  requireInit();
  const std::vector<int64_t> counts = {0, 1, 3, 4095, 4097, (1 << 16) + 1, (1 << 20) + 3,
                                       16 << 20};  // the last: 64 MiB of float32
  for (int64_t count : counts) {
    checkAllreduce(DataType::kFloat32, count, count % 2 == 1);
    if (count <= (1 << 20) + 3) checkAllreduce(DataType::kBFloat16, count, count % 2 == 0);
  }
}

TEST_CASE("shm: two subset process sets move large tensors at once") {
  requireInit();
  const int n = size(), me = rank();
  if (n < 4) {
    SUCCEED("needs two sets of two");
    return;
  }
  std::vector<int> even, odd;
  for (int r = 0; r < n; ++r) (r % 2 ? odd : even).push_back(r);
  int set_even = -1, set_odd = -1;
  REQUIRE(addProcessSet(even, &set_even).ok());
  REQUIRE(addProcessSet(odd, &set_odd).ok());
  const int mine = me % 2 ? set_odd : set_even;
  const auto& members = me % 2 ? odd : even;
  const int64_t count = (1 << 20) + 7;
  std::vector<HostTensor> tensors;
  std::vector<Handle> handles;
  for (int k = 0; k < 4; ++k) {
    tensors.emplace_back(DataType::kFloat32, std::vector<int64_t>{count});
    for (int64_t i = 0; i < count; ++i) tensors.back().set(i, valueAt(me, i + k));
  }
  for (int k = 0; k < 4; ++k) {
    OpOptions o;
    o.process_set = mine;
    handles.push_back(0);
    REQUIRE(allreduceAsync("shm.sets." + std::to_string(k), tensors[k].view(),
                           tensors[k].view(), o, &handles.back())
                .ok());
  }
  for (int k = 0; k < 4; ++k) {
    Status s = waitFor(handles[k]);
    INFO(describe(s));
    REQUIRE(s.ok());
    int64_t bad = -1;
    for (int64_t i = 0; i < count && bad < 0; ++i) {
      double expected = 0;
      for (int r : members) expected += valueAt(r, i + k);
      if (tensors[k].get(i) != expected) bad = i;
    }
    INFO("tensor " << k << ": first wrong element " << bad);
    CHECK(bad < 0);
  }
  // Each rank maps the world's two segments (control plane, data plane) and its own
  // set's two, not the other set's.
  CHECK(shmMappings().size() == 4);
  REQUIRE(removeProcessSet(set_even).ok());
  REQUIRE(removeProcessSet(set_odd).ok());
}
