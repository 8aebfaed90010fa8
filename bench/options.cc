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
  const std::string expected = "a byte count such as 8, 64K, 1.5M or 1G";
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) {
    bad(flag, text, expected);
  }
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  size_t number_end = digits;  // "1.5M": nccl-tests reads the number as a double
  if (number_end < text.size() && text[number_end] == '.') {
    ++number_end;
    while (number_end < text.size() &&
           std::isdigit(static_cast<unsigned char>(text[number_end]))) {
      ++number_end;
    }
  }
  std::string suffix = lower(text.substr(number_end));
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
  const unsigned long long limit = static_cast<unsigned long long>(
      std::numeric_limits<int64_t>::max()) >> shift;
  if (number_end > digits) {
    const double v = std::strtod(text.substr(0, number_end).c_str(), nullptr);
    const double scaled = std::ldexp(v, shift);
    if (!(scaled < 9.2e18)) bad(flag, text, expected + " below 2^63");
    return static_cast<int64_t>(scaled);
  }
  errno = 0;
  unsigned long long v = std::strtoull(text.substr(0, digits).c_str(), nullptr, 10);
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
  // nccl-tests' binaries' names too: a command line of theirs with the binary replaced.
  if (t == "allreduce" || t == "all_reduce" || t == "all_reduce_perf") return Workload::kAllreduce;
  if (t == "allgather" || t == "all_gather" || t == "all_gather_perf") return Workload::kAllgather;
  if (t == "broadcast" || t == "broadcast_perf") return Workload::kBroadcast;
  if (t == "alltoall" || t == "alltoall_perf") return Workload::kAlltoall;
  if (t == "reducescatter" || t == "reduce_scatter" || t == "reduce_scatter_perf") {
    return Workload::kReducescatter;
  }
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
         "  nccl-tests' flags: -b 8, -b8, --minbytes 8 and --minbytes=8 are the same\n"
         "  -b, --minbytes N      smallest size (K/M/G suffixes), default 32M (latency: 4)\n"
         "  -e, --maxbytes N      largest size, default 32M (latency: 4)\n"
         "  -f, --stepfactor F    multiply the size by F each step when F > 1, default 1\n"
         "  -i, --stepbytes N     else add N bytes each step, default 1M\n"
         "  -n, --iters N         timed iterations, default 20 (latency: 1000)\n"
         "  -w, --warmup_iters N  untimed iterations before each size, default 5\n"
         "  -m, --agg_iters N     submit N ops together per iteration, then wait for all;\n"
         "                        times are per op, default 1\n"
         "  -N, --run_cycles N    run the whole sweep N times, default 1\n"
         "  -c, --check 0/1       check every element against a local reference, default 1\n"
         "  -d, --datatype T      float half bfloat16 double int8 uint8 int16 uint16 int32\n"
         "                        int64 bool, or all (nccl-tests' types), default float\n"
         "  -o, --op OP           sum prod min max avg, or all, default sum\n"
         "  -r, --root R          broadcast root, default 0\n"
         "  -a, --average 0-3     combine times over ranks: 0 rank 0, 1 average, 2 min,\n"
         "                        3 max (nccl-tests' meaning), default 1\n"
         "  -C, --report_cputime 0/1   name the time column cputime (times are host times)\n"
         "  -T, --timeout S       end a collective that takes over S seconds\n"
         "                        (TUTTI_TIMEOUT_SECONDS), default 0: the runtime's\n"
         "  -J, --output_file F   as --json F (tutti-bench's document, not nccl-tests')\n"
         "  accepted with a notice (GPU or thread options with no meaning here):\n"
         "  -t -g -p -z -y -G -S -R -x -D -V -M -u -I -K and their long names\n"
         "  --baseline            time the bare backend on the same buffers: its time,\n"
         "                        busbw and tutti/baseline ratio follow nccl-tests' columns\n"
         "  --baseline-backend mpi|gloo   the bare library to compare with (implies\n"
         "                        --baseline), default: the one Tutti's CPU backend uses\n"
         "  --json FILE           also write the rows and metadata as JSON\n"
         "  --tensors T --tensor-bytes S   fusion: T tensors of S bytes per step\n"
         "                        (default: 256 x 4K and 64 x 256K)\n";
}

namespace {

// nccl-tests' getopt_long table (src/common.cu) and Tutti's own long options.
enum : char { kBaseline = 1, kBaselineBackend, kJson, kTensors, kTensorBytes };
struct Flag {
  char key;
  const char* long_name;
  bool takes_value;
};
const Flag kFlags[] = {
    {'t', "nthreads", true},       {'g', "ngpus", true},
    {'b', "minbytes", true},       {'e', "maxbytes", true},
    {'i', "stepbytes", true},      {'f', "stepfactor", true},
    {'n', "iters", true},          {'m', "agg_iters", true},
    {'w', "warmup_iters", true},   {'N', "run_cycles", true},
    {'p', "parallel_init", true},  {'c', "check", true},
    {'o', "op", true},             {'d', "datatype", true},
    {'r', "root", true},           {'z', "blocking", true},
    {'y', "stream_null", true},    {'T', "timeout", true},
    {'G', "cudagraph", true},      {'C', "report_cputime", true},
    {'S', "report_timestamps", true}, {'J', "output_file", true},
    {'a', "average", true},        {'R', "local_register", true},
    {'x', "cta_policy", true},     {'D', "device_implementation", true},
    {'V', "device_cta_count", true}, {'M', "memory", true},
    {'u', "unalign", true},        {'I', "per_iter_timing", true},
    {'K', "per_iter_skip", true},  {'h', "help", false},
    {kBaseline, "baseline", false}, {kBaselineBackend, "baseline-backend", true},
    {kJson, "json", true},         {kTensors, "tensors", true},
    {kTensorBytes, "tensor-bytes", true},
};

// "--name" exactly, else the one long name it is a prefix of (getopt_long's rule).
const Flag* findLong(const std::string& name, const std::string& arg) {
  const Flag* prefix = nullptr;
  int prefixes = 0;
  for (const Flag& f : kFlags) {
    if (name == f.long_name) return &f;
    if (!name.empty() && std::string(f.long_name).compare(0, name.size(), name) == 0) {
      prefix = &f;
      ++prefixes;
    }
  }
  if (prefixes == 1) return prefix;
  bad(arg, "", prefixes > 1 ? "an unambiguous flag (see --help)" : "a known flag (see --help)");
}

const Flag* findShort(char c, const std::string& arg) {
  for (const Flag& f : kFlags) {
    if (f.key == c) return &f;
  }
  bad(arg, "", "a known flag (see --help)");
}

// A flag of nccl-tests that has no meaning for CPU collectives: parsed (so junk is still an
// error) and, unless it asks for nccl-tests' default, announced as not applied.
void acceptNotice(Options* o, const std::string& flag, const std::string& v, int64_t lo,
                  int64_t hi, int64_t neutral, const std::string& why) {
  if (parseInt(v, flag, lo, hi) == neutral) return;
  o->notices.push_back("# tutti-bench: " + flag + " " + v + ": " + why);
}

void apply(Options* o, const Flag& f, const std::string& flag, const std::string& v,
           bool* have_b, bool* have_e, bool* have_n, int* tensors, int64_t* tensor_bytes) {
  const std::string one_rank =
      "not applied: tutti-bench runs one rank per process on CPU buffers; start more "
      "processes for more ranks";
  const std::string no_gpu = "not applied: tutti-bench times CPU collectives (no GPU)";
  switch (f.key) {
    case 'b': o->min_bytes = parseSize(v, flag); *have_b = true; break;
    case 'e': o->max_bytes = parseSize(v, flag); *have_e = true; break;
    case 'f':
      o->step_factor = parseDouble(v, flag);
      if (o->step_factor < 0) bad(flag, v, "a factor >= 0 (> 1 multiplies, else -i adds)");
      break;
    case 'i': o->step_bytes = parseSize(v, flag); break;
    case 'n': o->iters = static_cast<int>(parseInt(v, flag, 1, 100000000)); *have_n = true; break;
    case 'w': o->warmup_iters = static_cast<int>(parseInt(v, flag, 0, 100000000)); break;
    case 'c': o->check = parseInt(v, flag, 0, 1000000) != 0; break;
    case 'd':
      o->all_dtypes = lower(v) == "all";
      if (!o->all_dtypes) o->dtype = parseDataType(v);
      break;
    case 'o':
      o->all_ops = lower(v) == "all";
      if (!o->all_ops) o->op = parseReduceOp(v);
      break;
    case 'r': o->root = static_cast<int>(parseInt(v, flag, 0, 1 << 30)); break;
    case 'a': o->combine = static_cast<TimeCombine>(parseInt(v, flag, 0, 3)); break;
    case 'N':
      o->run_cycles = static_cast<int>(parseInt(v, flag, 0, 1000000));
      if (o->run_cycles == 0) {
        o->run_cycles = 1;
        o->notices.push_back("# tutti-bench: " + flag + " 0: runs 1 cycle (every run of "
                             "tutti-bench ends; give the number of cycles)");
      }
      break;
    case 'C': o->report_cputime = parseInt(v, flag, 0, 1) != 0; break;
    case 'T': o->timeout_seconds = static_cast<int>(parseInt(v, flag, 0, 1 << 30)); break;
    case 'J':
    case kJson:
      if (v.empty()) bad(flag, v, "a file name");
      o->json_path = v;
      if (f.key == 'J') {
        o->notices.push_back("# tutti-bench: " + flag + " " + v + ": writes tutti-bench's "
                             "JSON document (docs/PERFORMANCE.md), not nccl-tests' schema");
      }
      break;
    case 't': acceptNotice(o, flag, v, 1, 1 << 20, 1, one_rank); break;
    case 'g': acceptNotice(o, flag, v, 1, 1 << 20, 1, one_rank); break;
    case 'm': o->agg_iters = static_cast<int>(parseInt(v, flag, 1, 1024)); break;
    case 'p':
      acceptNotice(o, flag, v, 0, 1, 0, "not applied: each process initializes Tutti once");
      break;
    case 'z':
      acceptNotice(o, flag, v, 0, 3, 2,
                   "runs as -z 2: every collective is waited for before the next, with no "
                   "barrier between iterations");
      break;
    case 'G': acceptNotice(o, flag, v, 0, 1 << 20, 0, no_gpu); break;
    case 'y': case 'R': case 'x': case 'D': case 'M': case 'u': case 'I': case 'K':
      acceptNotice(o, flag, v, -1, 1 << 20, f.key == 'x' ? -1 : 0, no_gpu);
      break;
    case 'V': acceptNotice(o, flag, v, 0, 1 << 20, 16, no_gpu); break;
    case 'S':
      acceptNotice(o, flag, v, 0, 1, 0, "not applied: rows carry no timestamp column");
      break;
    case kBaselineBackend:
      if (v != "mpi" && v != "gloo") bad(flag, v, "mpi or gloo");
      o->baseline_backend = v;
      o->baseline = true;
      break;
    case kTensors: *tensors = static_cast<int>(parseInt(v, flag, 1, 1 << 20)); break;
    case kTensorBytes: *tensor_bytes = parseSize(v, flag); break;
    default: bad(flag, v, "a known flag (see --help)");
  }
}

}  // namespace

Options parseOptions(int argc, const char* const* argv) {
  Options o;
  for (int i = 0; i < argc; ++i) o.argv.push_back(argv[i]);
  bool have_b = false, have_e = false, have_n = false;
  int tensors = 0;
  int64_t tensor_bytes = -1;
  bool have_workload = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() < 2 || arg[0] != '-') {
      if (have_workload) bad("workload", arg, "a single workload name");
      o.workload = parseWorkload(arg);
      have_workload = true;
      continue;
    }
    const Flag* f = nullptr;
    std::string flag = arg, value;
    bool have_value = false;
    if (arg.compare(0, 2, "--") == 0) {
      const size_t eq = arg.find('=');
      flag = arg.substr(0, eq);
      f = findLong(flag.substr(2), flag);
      if (eq != std::string::npos) {
        if (!f->takes_value) bad(flag, arg.substr(eq + 1), "no value after the flag");
        value = arg.substr(eq + 1);
        have_value = true;
      }
    } else {
      flag = arg.substr(0, 2);
      f = findShort(arg[1], flag);
      if (arg.size() > 2) {
        if (!f->takes_value) bad(arg, "", "a known flag (see --help)");
        value = arg.substr(2);
        have_value = true;
      }
    }
    if (f->key == 'h') {
      o.help = true;
      return o;
    }
    if (f->key == kBaseline) {
      o.baseline = true;
      continue;
    }
    if (!have_value) {
      if (i + 1 >= argc) bad(flag, "", "a value after the flag");
      value = argv[++i];
    }
    apply(&o, *f, flag, value, &have_b, &have_e, &have_n, &tensors, &tensor_bytes);
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
  if (o.step_factor <= 1.0 && o.step_bytes <= 0 && o.min_bytes < o.max_bytes) {
    bad("-i", std::to_string(o.step_bytes), "an increment > 0, or -f > 1, to go from -b to -e");
  }
  if (o.agg_iters > 1 && (o.workload == Workload::kFusion || o.workload == Workload::kLatency)) {
    o.notices.push_back("# tutti-bench: -m " + std::to_string(o.agg_iters) + ": not applied: " +
                        workloadName(o.workload) + " has its own shape (--tensors, one op)");
    o.agg_iters = 1;
  }
  if ((o.all_dtypes || o.all_ops) &&
      (o.workload == Workload::kFusion || o.workload == Workload::kLatency)) {
    bad(o.all_dtypes ? "-d" : "-o", "all",
        "one type and op for fusion and latency (their rows have no type or op column)");
  }
  if ((tensors > 0) != (tensor_bytes >= 0)) {
    bad("--tensors/--tensor-bytes", "", "both flags together");
  }
  if (tensors > 0) {
    o.fusion_configs.push_back({tensors, tensor_bytes});
  } else {
    o.fusion_configs = {{256, 4 << 10}, {64, 256 << 10}};
  }
  sweepSizes(o);  // throws on a sweep too long to run
  return o;
}

std::vector<std::pair<DataType, ReduceOp>> typeOpRuns(const Options& options) {
  std::vector<DataType> dtypes = {options.dtype};
  if (options.all_dtypes) {
    dtypes = {DataType::kInt8,    DataType::kUInt8,   DataType::kInt32,   DataType::kInt64,
              DataType::kFloat16, DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16};
  }
  const bool reducing = options.workload == Workload::kAllreduce ||
                        options.workload == Workload::kReducescatter;
  std::vector<ReduceOp> ops = {options.op};
  if (options.all_ops && reducing) {
    ops = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAverage};
  }
  std::vector<std::pair<DataType, ReduceOp>> runs;
  for (DataType d : dtypes) {
    for (ReduceOp op : ops) runs.push_back({d, op});
  }
  return runs;
}

std::vector<int64_t> sweepSizes(const Options& options) {
  const size_t kMaxSizes = 100000;
  std::vector<int64_t> sizes;
  int64_t size = options.min_bytes;
  while (size <= options.max_bytes) {
    if (sizes.size() >= kMaxSizes) {
      bad(options.step_factor > 1.0 ? "-f" : "-i",
          options.step_factor > 1.0 ? std::to_string(options.step_factor)
                                    : std::to_string(options.step_bytes),
          "a step that goes from -b to -e in at most " + std::to_string(kMaxSizes) + " sizes");
    }
    sizes.push_back(size);
    int64_t next;
    if (options.step_factor > 1.0) {
      double scaled = static_cast<double>(size) * options.step_factor;
      next = scaled >= 9.2e18 ? options.max_bytes + 1 : static_cast<int64_t>(scaled);
    } else {
      next = options.step_bytes > options.max_bytes - size ? options.max_bytes + 1
                                                           : size + options.step_bytes;
    }
    if (next <= size) next = size + 1;  // -b 0 or a factor too small to move
    size = next;
  }
  return sizes;
}

}  // namespace bench
}  // namespace tutti
