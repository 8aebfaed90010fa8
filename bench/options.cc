#include "bench/options.h"

#include "bench/error.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace tutti {
namespace bench {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

[[noreturn]] void bad(const std::string& flag, const std::string& value,
                      const std::string& expected) {
  throwError(StatusCode::kInvalidArgument,
             "tutti-bench: " + flag + " '" + value + "': expected " + expected);
}

int64_t parseInt(const std::string& text, const std::string& flag, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0' || v < lo || v > hi) {
    bad(flag, text, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}

double parseDouble(const std::string& text, const std::string& flag) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v)) bad(flag, text, "a number");
  return v;
}

}  // namespace

int64_t parseSize(const std::string& text, const std::string& flag) {
  const std::string expected = "a byte count such as 8, 64K, 16M or 1G";
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) {
    bad(flag, text, expected);
  }
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  std::string suffix = lower(text.substr(digits));
  int shift = 0;
  if (suffix == "" || suffix == "b") {
    shift = 0;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    shift = 10;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    shift = 20;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    shift = 30;
  } else {
    bad(flag, text, expected);
  }
  errno = 0;
  unsigned long long v = std::strtoull(text.substr(0, digits).c_str(), nullptr, 10);
  const unsigned long long limit = static_cast<unsigned long long>(
      std::numeric_limits<int64_t>::max()) >> shift;
  if (errno != 0 || v > limit) bad(flag, text, expected + " below 2^63");
  return static_cast<int64_t>(v << shift);
}

DataType parseDataType(const std::string& text) {
  const std::string t = lower(text);
  if (t == "float" || t == "float32" || t == "fp32" || t == "f32") return DataType::kFloat32;
  if (t == "half" || t == "float16" || t == "fp16" || t == "f16") return DataType::kFloat16;
  if (t == "bfloat16" || t == "bf16") return DataType::kBFloat16;
  if (t == "double" || t == "float64" || t == "fp64" || t == "f64") return DataType::kFloat64;
  if (t == "int8" || t == "char") return DataType::kInt8;
  if (t == "uint8") return DataType::kUInt8;
  if (t == "int16") return DataType::kInt16;
  if (t == "uint16") return DataType::kUInt16;
  if (t == "int32" || t == "int") return DataType::kInt32;
  if (t == "int64") return DataType::kInt64;
  if (t == "bool") return DataType::kBool;
  bad("-d", text,
      "one of float, half, bfloat16, double, int8, uint8, int16, uint16, int32, int64, bool");
}

ReduceOp parseReduceOp(const std::string& text) {
  const std::string t = lower(text);
  if (t == "sum") return ReduceOp::kSum;
  if (t == "prod" || t == "product") return ReduceOp::kProduct;
  if (t == "min") return ReduceOp::kMin;
  if (t == "max") return ReduceOp::kMax;
  if (t == "avg" || t == "average") return ReduceOp::kAverage;
  bad("-o", text, "one of sum, prod, min, max, avg");
}

Workload parseWorkload(const std::string& text) {
  const std::string t = lower(text);
  if (t == "allreduce" || t == "all_reduce") return Workload::kAllreduce;
  if (t == "allgather" || t == "all_gather") return Workload::kAllgather;
  if (t == "broadcast") return Workload::kBroadcast;
  if (t == "alltoall") return Workload::kAlltoall;
  if (t == "reducescatter" || t == "reduce_scatter") return Workload::kReducescatter;
  if (t == "fusion") return Workload::kFusion;
  if (t == "latency") return Workload::kLatency;
  bad("workload", text,
      "one of allreduce, allgather, broadcast, alltoall, reducescatter, fusion, latency");
}

const char* workloadName(Workload workload) {
  switch (workload) {
    case Workload::kAllreduce: return "allreduce";
    case Workload::kAllgather: return "allgather";
    case Workload::kBroadcast: return "broadcast";
    case Workload::kAlltoall: return "alltoall";
    case Workload::kReducescatter: return "reducescatter";
    case Workload::kFusion: return "fusion";
    case Workload::kLatency: return "latency";
  }
  return "unknown";
}

const char* ncclTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return "float";
    case DataType::kFloat16: return "half";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat64: return "double";
    default: return dataTypeName(dtype);
  }
}

const char* ncclOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProduct: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAverage: return "avg";
  }
  return "unknown";
}

std::string usage() {
  return "usage: tutti-bench "
         "<allreduce|allgather|broadcast|alltoall|reducescatter|fusion|latency> [flags]\n"
         "  -b, --minbytes N      smallest size (K/M/G suffixes), default 32M (latency: 4)\n"
         "  -e, --maxbytes N      largest size, default 32M (latency: 4)\n"
         "  -f, --stepfactor F    multiply the size by F each step, default 2\n"
         "  -i, --stepbytes N     add N bytes each step instead of -f\n"
         "  -n, --iters N         timed iterations, default 20 (latency: 1000)\n"
         "  -w, --warmup_iters N  untimed iterations first, default 5\n"
         "  -c, --check 0/1       check every element against a local reference, default 1\n"
         "  -d, --datatype T      float half bfloat16 double int8 uint8 int16 uint16 int32\n"
         "                        int64 bool, default float\n"
         "  -o, --op OP           sum prod min max avg, default sum\n"
         "  -r, --root R          broadcast root, default 0\n"
         "  -a, --average 0-3     combine times over ranks: 0 rank 0, 1 average, 2 min,\n"
         "                        3 max (nccl-tests' meaning), default 1\n"
         "  --baseline            time the bare backend on the same buffers and print the\n"
         "                        ratio tutti/baseline beside each row\n"
         "  --baseline-backend mpi|gloo   the bare library to compare with (implies\n"
         "                        --baseline), default: the one Tutti's CPU backend uses\n"
         "  --json FILE           also write the rows and metadata as JSON\n"
         "  --tensors T --tensor-bytes S   fusion: T tensors of S bytes per step\n"
         "                        (default: 256 x 4K and 64 x 256K)\n";
}

Options parseOptions(int argc, const char* const* argv) {
  Options o;
  for (int i = 0; i < argc; ++i) o.argv.push_back(argv[i]);
  bool have_b = false, have_e = false, have_n = false;
  int tensors = 0;
  int64_t tensor_bytes = -1;
  bool have_workload = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      return o;
    }
    if (arg == "--baseline") {
      o.baseline = true;
      continue;
    }
    if (arg.empty() || arg[0] != '-') {
      if (have_workload) bad("workload", arg, "a single workload name");
      o.workload = parseWorkload(arg);
      have_workload = true;
      continue;
    }
    if (i + 1 >= argc) bad(arg, "", "a value after the flag");
    const std::string v = argv[++i];
    if (arg == "-b" || arg == "--minbytes") {
      o.min_bytes = parseSize(v, arg);
      have_b = true;
    } else if (arg == "-e" || arg == "--maxbytes") {
      o.max_bytes = parseSize(v, arg);
      have_e = true;
    } else if (arg == "-f" || arg == "--stepfactor") {
      o.step_factor = parseDouble(v, arg);
      if (o.step_factor <= 1.0) bad(arg, v, "a factor > 1");
      o.step_bytes = 0;
    } else if (arg == "-i" || arg == "--stepbytes") {
      o.step_bytes = parseSize(v, arg);
      if (o.step_bytes <= 0) bad(arg, v, "an increment > 0");
    } else if (arg == "-n" || arg == "--iters") {
      o.iters = static_cast<int>(parseInt(v, arg, 1, 100000000));
      have_n = true;
    } else if (arg == "-w" || arg == "--warmup_iters") {
      o.warmup_iters = static_cast<int>(parseInt(v, arg, 0, 100000000));
    } else if (arg == "-c" || arg == "--check") {
      o.check = parseInt(v, arg, 0, 1000000) != 0;
    } else if (arg == "-d" || arg == "--datatype") {
      o.dtype = parseDataType(v);
    } else if (arg == "-o" || arg == "--op") {
      o.op = parseReduceOp(v);
    } else if (arg == "-r" || arg == "--root") {
      o.root = static_cast<int>(parseInt(v, arg, 0, 1 << 30));
    } else if (arg == "-a" || arg == "--average") {
      o.combine = static_cast<TimeCombine>(parseInt(v, arg, 0, 3));
    } else if (arg == "--baseline-backend") {
      if (v != "mpi" && v != "gloo") bad(arg, v, "mpi or gloo");
      o.baseline_backend = v;
      o.baseline = true;
    } else if (arg == "--json") {
      o.json_path = v;
    } else if (arg == "--tensors") {
      tensors = static_cast<int>(parseInt(v, arg, 1, 1 << 20));
    } else if (arg == "--tensor-bytes") {
      tensor_bytes = parseSize(v, arg);
    } else {
      bad(arg, v, "a known flag (see --help)");
    }
  }
  if (!have_workload) bad("workload", "", "a workload name first (see --help)");
  if (o.workload == Workload::kLatency) {
    if (!have_b) o.min_bytes = 4;
    if (!have_e) o.max_bytes = std::max<int64_t>(o.min_bytes, 4);
    if (!have_n) o.iters = 1000;
  }
  if (have_b && !have_e) o.max_bytes = std::max(o.max_bytes, o.min_bytes);
  if (have_e && !have_b) o.min_bytes = std::min(o.min_bytes, o.max_bytes);
  if (o.min_bytes > o.max_bytes) {
    bad("-b", std::to_string(o.min_bytes), "at most -e (" + std::to_string(o.max_bytes) + ")");
  }
  if ((tensors > 0) != (tensor_bytes >= 0)) {
    bad("--tensors/--tensor-bytes", "", "both flags together");
  }
  if (tensors > 0) {
    o.fusion_configs.push_back({tensors, tensor_bytes});
  } else {
    o.fusion_configs = {{256, 4 << 10}, {64, 256 << 10}};
  }
  return o;
}

std::vector<int64_t> sweepSizes(const Options& options) {
  std::vector<int64_t> sizes;
  int64_t size = options.min_bytes;
  while (size <= options.max_bytes) {
    sizes.push_back(size);
    int64_t next;
    if (options.step_bytes > 0) {
      next = size + options.step_bytes;
    } else {
      double scaled = static_cast<double>(size) * options.step_factor;
      next = scaled >= 9.2e18 ? options.max_bytes + 1 : static_cast<int64_t>(scaled);
      if (next <= size) next = size + 1;  // -b 0 or a factor too small to move
    }
    size = next;
  }
  return sizes;
}

}  // namespace bench
}  // namespace tutti
