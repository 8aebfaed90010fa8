#include "core/message.h"

#include <cstring>
#include <type_traits>

namespace tutti {
namespace {

constexpr uint32_t kRequestMagic = 0x54525131;   // "TRQ1"
constexpr uint32_t kResponseMagic = 0x54525331;  // "TRS1"

class Writer {
 public:
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable<T>::value, "POD only");
    const char* p = reinterpret_cast<const char*>(&value);
    out_.append(p, sizeof(T));
  }
  void putString(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  template <typename T>
  void putVector(const std::vector<T>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    if (!v.empty()) out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string getString() {
    uint32_t n = get<uint32_t>();
    need(n);
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> getVector() {
    uint32_t n = get<uint32_t>();
    need(static_cast<size_t>(n) * sizeof(T));
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), in_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  template <typename E>
  E getEnum(int limit, const char* what) {
    auto raw = get<uint8_t>();
    if (raw >= limit) throwError(StatusCode::kInternal, std::string("malformed message: bad ") + what);
    return static_cast<E>(raw);
  }
  void expectEnd() const {
    if (pos_ != in_.size()) throwError(StatusCode::kInternal, "malformed message: trailing bytes");
  }

 private:
  void need(size_t n) const {
    if (n > in_.size() - pos_)
      throwError(StatusCode::kInternal, "malformed message: truncated (need " +
                                            std::to_string(n) + " bytes at offset " +
                                            std::to_string(pos_) + " of " +
                                            std::to_string(in_.size()) + ")");
  }
  const std::string& in_;
  size_t pos_ = 0;
};

void checkMagic(Reader& r, uint32_t magic, const char* what) {
  if (r.get<uint32_t>() != magic)
    throwError(StatusCode::kInternal, std::string("malformed ") + what + ": bad magic/version");
}

[[noreturn]] void malformed(const std::string& what) {
  throwError(StatusCode::kInternal, "malformed response list: " + what);
}

bool allNonNegative(const std::vector<int64_t>& values) {
  for (int64_t v : values)
    if (v < 0) return false;
  return true;
}

// What the executor relies on: a name to report, one non-negative count per name where
// counts are used, no negative rows or splits, a status code of tutti.h.
void checkResponse(const Response& s) {
  if (s.names.empty()) malformed("a response without a tensor name");
  if (s.error_code < StatusCode::kOk || s.error_code > StatusCode::kInternal)
    malformed("status code " + std::to_string(static_cast<int>(s.error_code)));
  if (s.type == ResponseType::kError) return;
  const bool counted = s.op == OpType::kAllreduce || s.op == OpType::kBroadcast ||
                       s.op == OpType::kReducescatter;
  if (counted && s.counts.size() != s.names.size())
    malformed(std::string(opTypeName(s.op)) + " with " + std::to_string(s.names.size()) +
              " names but " + std::to_string(s.counts.size()) + " counts");
  if (!allNonNegative(s.counts) || !allNonNegative(s.first_dims) ||
      (s.op == OpType::kAlltoall && !allNonNegative(s.splits)))
    malformed(std::string(opTypeName(s.op)) + " " + quotedName(s.names[0]) +
              " with a negative count, row or split");
}

}  // namespace

bool Request::operator==(const Request& o) const {
  return rank == o.rank && op == o.op && dtype == o.dtype && reduce_op == o.reduce_op &&
         device == o.device && root == o.root && prescale == o.prescale &&
         postscale == o.postscale && name == o.name && shape == o.shape && splits == o.splits &&
         group == o.group && group_size == o.group_size;
}

namespace {

// A request list's bytes from its requests wherever they are (a list, queue entries).
template <typename Requests, typename Deref>
std::string serializeList(const Requests& requests, bool shutdown, Deref deref) {
  Writer w;
  w.put<uint32_t>(kRequestMagic);
  w.put<uint8_t>(shutdown ? 1 : 0);
  w.put<uint32_t>(static_cast<uint32_t>(requests.size()));
  for (const auto& item : requests) {
    const Request& q = deref(item);
    w.put<uint8_t>(static_cast<uint8_t>(q.op));
    w.put<uint8_t>(static_cast<uint8_t>(q.dtype));
    w.put<uint8_t>(static_cast<uint8_t>(q.reduce_op));
    w.put<uint8_t>(static_cast<uint8_t>(q.device));
    w.put<int32_t>(q.root);
    w.put<double>(q.prescale);
    w.put<double>(q.postscale);
    w.putString(q.name);
    w.putVector(q.shape);
    w.putVector(q.splits);
    w.putString(q.group);
    w.put<int32_t>(q.group_size);
  }
  return w.take();
}

}  // namespace

std::string serialize(const RequestList& list) {
  return serializeList(list.requests, list.shutdown,
                       [](const Request& q) -> const Request& { return q; });
}

std::string serializeRequests(const std::vector<const Request*>& requests) {
  return serializeList(requests, false, [](const Request* q) -> const Request& { return *q; });
}

RequestList parseRequestList(const std::string& bytes) {
  Reader r(bytes);
  checkMagic(r, kRequestMagic, "request list");
  RequestList list;
  list.shutdown = r.get<uint8_t>() != 0;
  uint32_t n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) {
    Request q;
    q.op = r.getEnum<OpType>(kNumOpTypes, "op");
    q.dtype = r.getEnum<DataType>(kNumDataTypes, "dtype");
    q.reduce_op = r.getEnum<ReduceOp>(5, "reduce op");
    q.device = r.getEnum<DeviceType>(2, "device");
    q.root = r.get<int32_t>();
    q.prescale = r.get<double>();
    q.postscale = r.get<double>();
    q.name = r.getString();
    q.shape = r.getVector<int64_t>();
    q.splits = r.getVector<int64_t>();
    q.group = r.getString();
    q.group_size = r.get<int32_t>();
    list.requests.push_back(std::move(q));
  }
  r.expectEnd();
  return list;
}

std::string serialize(const ResponseList& list) {
  Writer w;
  w.put<uint32_t>(kResponseMagic);
  w.putString(list.fatal_error);
  w.put<uint32_t>(static_cast<uint32_t>(list.responses.size()));
  for (const auto& s : list.responses) {
    w.put<uint8_t>(static_cast<uint8_t>(s.type));
    w.put<uint8_t>(static_cast<uint8_t>(s.op));
    w.put<uint32_t>(static_cast<uint32_t>(s.names.size()));
    for (const auto& name : s.names) w.putString(name);
    w.putVector(s.counts);
    w.put<uint8_t>(static_cast<uint8_t>(s.dtype));
    w.put<uint8_t>(static_cast<uint8_t>(s.reduce_op));
    w.put<uint8_t>(static_cast<uint8_t>(s.device));
    w.put<int32_t>(s.root);
    w.put<double>(s.prescale);
    w.put<double>(s.postscale);
    w.putVector(s.first_dims);
    w.putVector(s.splits);
    w.put<int32_t>(s.value);
    w.put<int32_t>(static_cast<int32_t>(s.error_code));
    w.putString(s.error_message);
  }
  return w.take();
}

ResponseList parseResponseList(const std::string& bytes) {
  Reader r(bytes);
  checkMagic(r, kResponseMagic, "response list");
  ResponseList list;
  list.fatal_error = r.getString();
  uint32_t n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) {
    Response s;
    s.type = r.getEnum<ResponseType>(2, "response type");
    s.op = r.getEnum<OpType>(kNumOpTypes, "op");
    uint32_t names = r.get<uint32_t>();
    for (uint32_t k = 0; k < names; ++k) s.names.push_back(r.getString());
    s.counts = r.getVector<int64_t>();
    s.dtype = r.getEnum<DataType>(kNumDataTypes, "dtype");
    s.reduce_op = r.getEnum<ReduceOp>(5, "reduce op");
    s.device = r.getEnum<DeviceType>(2, "device");
    s.root = r.get<int32_t>();
    s.prescale = r.get<double>();
    s.postscale = r.get<double>();
    s.first_dims = r.getVector<int64_t>();
    s.splits = r.getVector<int64_t>();
    s.value = r.get<int32_t>();
    s.error_code = static_cast<StatusCode>(r.get<int32_t>());
    s.error_message = r.getString();
    checkResponse(s);
    list.responses.push_back(std::move(s));
  }
  r.expectEnd();
  return list;
}

void checkResponseForSet(const Response& r, int set_size) {
  if (r.names.empty()) malformed("a response without a tensor name");
  if (r.type == ResponseType::kError) return;
  const std::string what = std::string(opTypeName(r.op)) + " " + quotedName(r.names[0]);
  auto bad = [&](const std::string& expected, const std::string& got) {
    malformed(what + ": expected " + expected + " for a process set of " +
              std::to_string(set_size) + ", got " + got);
  };
  const size_t n = static_cast<size_t>(set_size);
  int64_t rows = 0;
  switch (r.op) {
    case OpType::kAllgather:
      if (r.first_dims.size() != n)
        bad("one row count per member", std::to_string(r.first_dims.size()));
      for (int64_t d : r.first_dims)
        if (!checkedAdd(rows, d, &rows))
          bad("rows that sum within int64", shapeString(r.first_dims));
      break;
    case OpType::kAlltoall:
      if (r.splits.size() != n * n)
        bad(std::to_string(n * n) + " splits", std::to_string(r.splits.size()));
      break;
    case OpType::kBroadcast:
      if (r.root < 0 || r.root >= set_size) bad("a root in [0, " + std::to_string(set_size) + ")",
                                                 std::to_string(r.root));
      break;
    default:
      break;
  }
}

}  // namespace tutti
