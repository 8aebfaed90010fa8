#include "bench/report.h"

#include "bench/error.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdarg>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

namespace tutti {
namespace bench {
namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += format("\\u%04x", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string jsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  return format("%.6g", v);
}

std::string modeJson(const ModeResult& m) {
  if (!m.present) return "null";
  std::string s = "{\"time_us\": " + jsonNumber(m.time_us) +
                  ", \"algbw\": " + jsonNumber(m.algbw) + ", \"busbw\": " + jsonNumber(m.busbw) +
                  ", \"wrong\": " + std::to_string(m.wrong);
  if (m.has_baseline) {
    s += ", \"baseline_time_us\": " + jsonNumber(m.base_time_us) +
         ", \"baseline_busbw\": " + jsonNumber(m.base_busbw) +
         ", \"ratio\": " + jsonNumber(m.time_us / m.base_time_us) +
         ", \"baseline_wrong\": " + std::to_string(m.base_wrong);
  }
  return s + "}";
}

std::string statsJson(const LatencyStats& s) {
  return "{\"median_us\": " + jsonNumber(s.median_us) + ", \"p99_us\": " + jsonNumber(s.p99_us) +
         ", \"max_us\": " + jsonNumber(s.max_us) + "}";
}

std::string wrongText(int64_t wrong) { return wrong < 0 ? "N/A" : std::to_string(wrong); }

}  // namespace

double busBandwidthFactor(const std::string& collective, int nranks) {
  const double n = nranks;
  if (collective == "allreduce") return nranks > 1 ? 2.0 * (n - 1) / n : 0.0;
  if (collective == "allgather" || collective == "reducescatter" || collective == "alltoall") {
    return (n - 1) / n;
  }
  return 1.0;  // broadcast
}

std::string fitNumber(double value, int width) {
  char buf[64];
  for (const char* fmt : {"%*.2f", "%*.1f", "%*.0f"}) {
    if (snprintf(buf, sizeof buf, fmt, width, value) <= width) return buf;
  }
  snprintf(buf, sizeof buf, width >= 7 ? "%*.1e" : "%*.0e", width, value);
  return buf;
}

std::string formatTime(double us) {
  if (us < 1e4) return format("%.2f", us);
  if (us < 1e5) return format("%.1f", us);
  return format("%.0f", us);
}

void fillMachine(Metadata* meta) {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) meta->hostname = host;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) meta->cpu_model = line.substr(colon + 2);
      break;
    }
  }
  meta->cores = static_cast<int>(std::thread::hardware_concurrency());
  std::ifstream load("/proc/loadavg");
  std::getline(load, meta->loadavg);
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  meta->date = date;
}

double measureMemcpy() {
  const size_t bytes = 64u << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    auto start = std::chrono::steady_clock::now();
    std::memcpy(rep % 2 ? a.data() : b.data(), rep % 2 ? b.data() : a.data(), bytes);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return static_cast<double>(bytes) / best / 1e9;
}

LatencyStats latencyStats(std::vector<double>* samples) {
  LatencyStats s;
  if (samples->empty()) return s;
  std::sort(samples->begin(), samples->end());
  const size_t n = samples->size();
  s.median_us = n % 2 ? (*samples)[n / 2] : 0.5 * ((*samples)[n / 2 - 1] + (*samples)[n / 2]);
  size_t p99 = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n))) - 1;
  s.p99_us = (*samples)[std::min(p99, n - 1)];
  s.max_us = samples->back();
  return s;
}

Report::Report(Metadata meta, FILE* out) : meta_(std::move(meta)), out_(out) {}

void Report::print(const char* fmt, ...) const {
  if (!out_) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(out_, fmt, ap);
  va_end(ap);
}

void Report::printMachine() const {
  print("# %s, %s, %d cores, load average %s, %s\n", meta_.hostname.c_str(),
        meta_.cpu_model.c_str(), meta_.cores, meta_.loadavg.c_str(), meta_.date.c_str());
}

std::string Report::backendText() const {
  std::string s = meta_.backend.empty() ? meta_.transport : meta_.backend;
  if (!meta_.transport.empty() && meta_.transport != s) s += " (transport " + meta_.transport + ")";
  return s.empty() ? "unknown" : s;
}

// nccl-tests' table (src/util.cu): the same columns at the same widths, so that a script
// that parses its output parses this one; --baseline's columns come after all of them.
void Report::beginSweep(bool with_baseline) {
  if (began_) return;  // -N: later cycles add rows to the first table
  began_ = true;
  with_baseline_ = with_baseline;
  print("# tutti-bench %s: %d ranks, backend %s, baseline %s, dtype %s, op %s, iters %d, "
        "agg iters %d, warmup %d, check %d, times: %s over ranks\n",
        meta_.workload.c_str(), meta_.ranks, backendText().c_str(),
        meta_.baseline.empty() ? "none" : meta_.baseline.c_str(), meta_.dtype.c_str(),
        meta_.op.c_str(), meta_.iters, meta_.agg_iters, meta_.warmup_iters,
        meta_.check ? 1 : 0, meta_.combine.c_str());
  printMachine();
  print("#\n");
  const char* time = meta_.cputime ? "cputime" : "time";
  std::string groups = format("# %10s  %12s  %8s  %6s  %6s           out-of-place                  "
                              "     in-place          ", "", "", "", "", "");
  std::string head = format("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s",
                            "size", "count", "type", "redop", "root", time, "algbw", "busbw",
                            "#wrong", time, "algbw", "busbw", "#wrong");
  std::string unit = format("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s",
                            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "",
                            "(us)", "(GB/s)", "(GB/s)", "");
  if (with_baseline) {
    // Out-of-place's bare time, busbw and tutti/bare ratio, then in-place's.
    groups += "  baseline out-of-place      baseline in-place";
    head += format("  %9s  %7s  %6s  %9s  %7s  %6s", "base_time", "base_bw", "ratio",
                   "base_time", "base_bw", "ratio");
    unit += format("  %9s  %7s  %6s  %9s  %7s  %6s", "(us)", "(GB/s)", "", "(us)", "(GB/s)", "");
  }
  print("%s\n%s\n%s\n", groups.c_str(), head.c_str(), unit.c_str());
  if (out_) fflush(out_);
}

void Report::printMode(const ModeResult& m) const {
  if (!m.present) {
    print("  %7s  %6s  %6s  %6s", "N/A", "N/A", "N/A", "N/A");
    return;
  }
  print("  %7s  %6s  %6s  %6s", fitNumber(m.time_us, 7).c_str(), fitNumber(m.algbw, 6).c_str(),
        fitNumber(m.busbw, 6).c_str(), wrongText(m.wrong).c_str());
}

void Report::printBaseline(const ModeResult& m) const {
  if (!m.present || !m.has_baseline) {
    print("  %9s  %7s  %6s", "N/A", "N/A", "N/A");
    return;
  }
  print("  %9s  %7s  %6s", fitNumber(m.base_time_us, 9).c_str(),
        fitNumber(m.base_busbw, 7).c_str(),
        fitNumber(m.base_time_us > 0 ? m.time_us / m.base_time_us : 0.0, 6).c_str());
}

void Report::addSweepRow(const SweepRow& row) {
  sweep_.push_back(row);
  print("%12lld  %12lld  %8s  %6s  %6d", static_cast<long long>(row.bytes),
        static_cast<long long>(row.count), row.type.c_str(), row.redop.c_str(), row.root);
  printMode(row.out_of_place);
  printMode(row.in_place);
  if (with_baseline_) {
    printBaseline(row.out_of_place);
    printBaseline(row.in_place);
  }
  print("\n");
  if (out_) fflush(out_);
}

void Report::beginFusion(bool with_baseline) {
  if (began_) return;  // -N: later cycles add rows to the first table
  began_ = true;
  with_baseline_ = with_baseline;
  print("# tutti-bench fusion: %d ranks, backend %s, baseline %s, dtype %s, op %s, steps %d, "
        "warmup %d, check %d, times: %s over ranks\n",
        meta_.ranks, backendText().c_str(),
        meta_.baseline.empty() ? "none" : meta_.baseline.c_str(), meta_.dtype.c_str(),
        meta_.op.c_str(), meta_.iters, meta_.warmup_iters, meta_.check ? 1 : 0,
        meta_.combine.c_str());
  printMachine();
  print("# step = every tensor enqueued, then every handle waited; grouped = one "
        "groupedAllreduce of the same tensors\n");
  print("# per-tensor = one bare call per tensor; packed = memcpy in + one bare call + memcpy out\n#\n");
  print("# %7s %12s %11s %11s %11s %11s %8s %8s %6s\n", "tensors", "bytes/tensor",
        "tutti(us)", "grouped(us)", "per-tensor", "packed(us)", "/packed", "pt/tutti", "#wrong");
}

void Report::addFusionRow(const FusionRow& row) {
  fusion_.push_back(row);
  print("  %7d %12lld %11s %11s", row.tensors, static_cast<long long>(row.tensor_bytes),
        formatTime(row.tutti_us).c_str(), formatTime(row.tutti_grouped_us).c_str());
  if (row.has_baseline) {
    print(" %11s %11s %8.2f %8.2f", formatTime(row.per_tensor_us).c_str(),
          formatTime(row.packed_us).c_str(), row.tutti_us / row.packed_us,
          row.per_tensor_us / row.tutti_us);
  } else {
    print(" %11s %11s %8s %8s", "N/A", "N/A", "N/A", "N/A");
  }
  print(" %6s\n", wrongText(row.wrong).c_str());
  if (out_) fflush(out_);
}

void Report::beginLatency(bool with_baseline) {
  if (began_) return;  // -N: later cycles add rows to the first table
  began_ = true;
  with_baseline_ = with_baseline;
  print("# tutti-bench latency: %d ranks, backend %s, baseline %s, dtype %s, op %s, iters %d, "
        "warmup %d, check %d, per-rank statistics: %s over ranks\n",
        meta_.ranks, backendText().c_str(),
        meta_.baseline.empty() ? "none" : meta_.baseline.c_str(), meta_.dtype.c_str(),
        meta_.op.c_str(), meta_.iters, meta_.warmup_iters, meta_.check ? 1 : 0,
        meta_.combine.c_str());
  printMachine();
  print("#\n");
  print("# %10s %10s %10s %10s %10s %10s %10s %8s %6s\n", "size(B)", "median(us)", "p99(us)",
        "max(us)", "base_med", "base_p99", "base_max", "ratio", "#wrong");
}

void Report::addLatencyRow(const LatencyRow& row) {
  latency_.push_back(row);
  print("  %10lld %10.2f %10.2f %10.2f", static_cast<long long>(row.bytes), row.tutti.median_us,
        row.tutti.p99_us, row.tutti.max_us);
  if (row.has_baseline) {
    print(" %10.2f %10.2f %10.2f %8.2f", row.baseline.median_us, row.baseline.p99_us,
          row.baseline.max_us, row.tutti.median_us / row.baseline.median_us);
  } else {
    print(" %10s %10s %10s %8s", "N/A", "N/A", "N/A", "N/A");
  }
  print(" %6s\n", wrongText(row.wrong).c_str());
  if (out_) fflush(out_);
}

double Report::averageBusBandwidth() const {
  double sum = 0;
  int n = 0;
  for (const SweepRow& row : sweep_) {
    for (const ModeResult* m : {&row.out_of_place, &row.in_place}) {
      if (m->present) {
        sum += m->busbw;
        ++n;
      }
    }
  }
  return n ? sum / n : 0.0;
}

double Report::bestBusBandwidth() const {
  double best = 0;
  for (const SweepRow& row : sweep_)
    for (const ModeResult* m : {&row.out_of_place, &row.in_place})
      if (m->present) best = std::max(best, m->busbw);
  return best;
}

void Report::finish(int64_t total_wrong) {
  total_wrong_ = total_wrong;
  print("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
        total_wrong == 0 ? "OK" : "FAILED");
  if (!sweep_.empty()) print("# Avg bus bandwidth    : %g \n", averageBusBandwidth());
  printRowBackends();
  if (!sweep_.empty() && meta_.memcpy_gbps > 0)
    print("# memcpy bandwidth     : %.2f GB/s (one core); best busbw %.2f GB/s = %.0f%% of it\n",
          meta_.memcpy_gbps, bestBusBandwidth(), 100.0 * bestBusBandwidth() / meta_.memcpy_gbps);
  print("#\n");
  if (out_) fflush(out_);
}

// "# Moved by             : shm 8..64K, mpi 128K..32M" when some rows' data went through
// another backend than the header's (shm hands some broadcast sizes to the next backend).
void Report::printRowBackends() const {
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> spans;
  bool other = false;
  for (const SweepRow& row : sweep_) {
    if (row.backend.empty()) continue;
    other = other || row.backend != meta_.backend;
    if (spans.empty() || spans.back().first != row.backend) {
      spans.push_back({row.backend, {row.bytes, row.bytes}});
    } else {
      spans.back().second.second = row.bytes;
    }
  }
  if (!other) return;
  std::string text;
  for (const auto& span : spans) {
    text += (text.empty() ? "" : ", ") + span.first + " " + std::to_string(span.second.first) +
            ".." + std::to_string(span.second.second) + " B";
  }
  print("# %-20s : %s\n", "Moved by", text.c_str());
}

std::string Report::json() const {
  std::ostringstream js;
  js << "{\n  \"tool\": \"tutti-bench\",\n  \"workload\": " << jsonString(meta_.workload)
     << ",\n  \"command\": " << jsonString(meta_.command) << ",\n  \"ranks\": " << meta_.ranks
     << ",\n  \"backend\": " << jsonString(meta_.backend)
     << ",\n  \"transport\": " << jsonString(meta_.transport)
     << ",\n  \"baseline\": " << (meta_.baseline.empty() ? "null" : jsonString(meta_.baseline))
     << ",\n  \"machine\": {\"hostname\": " << jsonString(meta_.hostname)
     << ", \"cpu_model\": " << jsonString(meta_.cpu_model) << ", \"cores\": " << meta_.cores
     << ", \"loadavg\": " << jsonString(meta_.loadavg)
     << ", \"memcpy_gbps\": " << jsonNumber(meta_.memcpy_gbps)
     << "},\n  \"date\": " << jsonString(meta_.date) << ",\n  \"dtype\": "
     << jsonString(meta_.dtype) << ",\n  \"op\": " << jsonString(meta_.op)
     << ",\n  \"iters\": " << meta_.iters << ",\n  \"agg_iters\": " << meta_.agg_iters
     << ",\n  \"warmup_iters\": " << meta_.warmup_iters
     << ",\n  \"check\": " << (meta_.check ? "true" : "false")
     << ",\n  \"time_combine\": " << jsonString(meta_.combine)
     << ",\n  \"wrong\": " << total_wrong_;
  if (!sweep_.empty()) js << ",\n  \"avg_busbw\": " << jsonNumber(averageBusBandwidth());
  js << ",\n  \"rows\": [";
  for (size_t i = 0; i < sweep_.size(); ++i) {
    const SweepRow& r = sweep_[i];
    js << (i ? ",\n" : "\n") << "    {\"size\": " << r.bytes << ", \"count\": " << r.count
       << ", \"type\": " << jsonString(r.type) << ", \"redop\": " << jsonString(r.redop)
       << ", \"root\": " << r.root << ", \"backend\": " << jsonString(r.backend)
       << ",\n     \"out_of_place\": " << modeJson(r.out_of_place)
       << ",\n     \"in_place\": " << modeJson(r.in_place) << "}";
  }
  js << "\n  ],\n  \"fusion\": [";
  for (size_t i = 0; i < fusion_.size(); ++i) {
    const FusionRow& r = fusion_[i];
    js << (i ? ",\n" : "\n") << "    {\"tensors\": " << r.tensors
       << ", \"tensor_bytes\": " << r.tensor_bytes << ", \"tutti_step_us\": "
       << jsonNumber(r.tutti_us) << ", \"tutti_grouped_step_us\": "
       << jsonNumber(r.tutti_grouped_us) << ", \"wrong\": " << r.wrong;
    if (r.has_baseline) {
      js << ", \"baseline_per_tensor_us\": " << jsonNumber(r.per_tensor_us)
         << ", \"baseline_packed_us\": " << jsonNumber(r.packed_us);
    }
    js << "}";
  }
  js << "\n  ],\n  \"latency\": [";
  for (size_t i = 0; i < latency_.size(); ++i) {
    const LatencyRow& r = latency_[i];
    js << (i ? ",\n" : "\n") << "    {\"size\": " << r.bytes << ", \"tutti\": "
       << statsJson(r.tutti) << ", \"wrong\": " << r.wrong;
    if (r.has_baseline) js << ", \"baseline\": " << statsJson(r.baseline);
    js << "}";
  }
  js << "\n  ]\n}\n";
  return js.str();
}

void Report::writeJson(const std::string& path) const {
  std::ofstream f(path);
  f << json();
  f.close();
  if (!f) {
    throwError(StatusCode::kInvalidArgument,
               "tutti-bench: --json '" + path + "': cannot write the file");
  }
}

}  // namespace bench
}  // namespace tutti
