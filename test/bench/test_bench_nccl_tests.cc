// tutti-bench against nccl-tests (src/common.cu, src/util.cu): its getopt_long spellings,
// its step rule, its flags that have no CPU meaning (a notice), -d/-o all, and its table's
// columns and widths with --baseline's after them. No processes, no runtime.
#include "bench/error.h"
#include "bench/options.h"
#include "bench/report.h"

#include "test/bench/parse_args.h"
#include "test/catch.h"

#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

using namespace tutti;
using namespace tutti::bench;

namespace {

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// What the report printed, split in lines.
std::vector<std::string> printed(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::vector<std::string> lines;
  std::string line;
  for (int c; (c = std::fgetc(f)) != EOF;) {
    if (c == '\n') {
      lines.push_back(line);
      line.clear();
    } else {
      line += static_cast<char>(c);
    }
  }
  return lines;
}

}  // namespace

TEST_CASE("nccl-tests' spellings: -b8, --minbytes=8, unique prefixes, the workload anywhere") {
  Options o = parse({"-b8", "--maxbytes=1M", "allreduce", "--stepf", "4", "--iters=3", "-w0",
                     "--datatype=half", "--op", "max", "--check=0", "-a2", "--warmup=2"});
  CHECK(o.workload == Workload::kAllreduce);
  CHECK(o.min_bytes == 8);
  CHECK(o.max_bytes == 1 << 20);
  CHECK(o.step_factor == 4.0);
  CHECK(o.iters == 3);
  CHECK(o.warmup_iters == 2);
  CHECK(o.dtype == DataType::kFloat16);
  CHECK(o.op == ReduceOp::kMax);
  CHECK_FALSE(o.check);
  CHECK(o.combine == TimeCombine::kMin);
  CHECK(parse({"all_gather_perf", "--minbytes", "1K"}).workload == Workload::kAllgather);
  CHECK(parse({"reduce_scatter_perf"}).workload == Workload::kReducescatter);
  CHECK(parse({"broadcast", "--root=1", "--json=out.json"}).json_path == "out.json");
  CHECK(parse({"allreduce", "--baseline-backend=mpi"}).baseline_backend == "mpi");
  CHECK(parse({"allreduce", "--help"}).help);
  for (std::vector<const char*> bad :
       {std::vector<const char*>{"allreduce", "--m=8"},        // minbytes or maxbytes?
        std::vector<const char*>{"allreduce", "--baseline=1"}, // takes no value
        std::vector<const char*>{"allreduce", "-q", "1"},
        std::vector<const char*>{"allreduce", "--minbytes="},  // empty size
        std::vector<const char*>{"allreduce", "-b"}}) {
    INFO(bad.back());
    CHECK_THROWS_AS(parse(bad), Error);
  }
}

TEST_CASE("nccl-tests' step rule: -f > 1 multiplies whatever -i says, else -i (1M) adds") {
  // No -f: nccl-tests adds its default -i of 1M.
  CHECK(sweepSizes(parse({"allreduce", "-b", "1M", "-e", "3M"})) ==
        std::vector<int64_t>{1 << 20, 2 << 20, 3 << 20});
  // -f 2 wins over -i, in either order.
  for (auto args : {std::vector<const char*>{"allreduce", "-b", "1K", "-e", "8K", "-f", "2", "-i", "1M"},
                    std::vector<const char*>{"allreduce", "-b", "1K", "-e", "8K", "-i", "1M", "-f", "2"}}) {
    CHECK(sweepSizes(parse(args)) == std::vector<int64_t>{1024, 2048, 4096, 8192});
  }
  // -f 1 (or 0): steps of -i.
  CHECK(sweepSizes(parse({"allreduce", "-b", "0", "-e", "1K", "-f", "1", "-i", "512"})) ==
        std::vector<int64_t>{0, 512, 1024});
}

TEST_CASE("nccl-tests' GPU and thread flags: accepted, announced unless nccl-tests' default") {
  Options o = parse({"allreduce", "-g", "8", "-t", "1", "-m", "4", "-p", "1", "-z", "0",
                     "-G", "10", "-y", "0", "--blocking=2", "-N", "3", "-C", "1", "-T", "60",
                     "-R", "1", "-x", "0", "-D", "0", "-V", "16", "-M", "1", "-u", "0", "-I",
                     "1", "-K", "0", "-S", "1", "-J", "run.json"});
  CHECK(o.run_cycles == 3);
  CHECK(o.report_cputime);
  CHECK(o.timeout_seconds == 60);
  CHECK(o.json_path == "run.json");
  std::string all;
  for (const std::string& n : o.notices) all += n + "\n";
  INFO(all);
  CHECK(o.agg_iters == 4);
  for (const char* flag : {"-g 8:", "-p 1:", "-z 0:", "-G 10:", "-R 1:", "-x 0:",
                           "-M 1:", "-I 1:", "-S 1:", "-J run.json:"}) {
    CHECK(all.find(std::string("# tutti-bench: ") + flag) != std::string::npos);
  }
  for (const char* flag : {"-t ", "-m ", "-y ", "--blocking", "-D ", "-V ", "-u ", "-K ", "-N ", "-C ",
                           "-T "}) {
    CHECK(all.find(std::string("# tutti-bench: ") + flag) == std::string::npos);
  }
  CHECK(o.notices.size() == 10);
  Options f = parse({"fusion", "-m", "4"});  // fusion and latency have their own shape
  CHECK(f.agg_iters == 1);
  REQUIRE(f.notices.size() == 1);
  CHECK(f.notices[0].find("-m 4: not applied") != std::string::npos);
  CHECK_THROWS_AS(parse({"allreduce", "-m", "0"}), Error);
  CHECK(parse({"allreduce", "-N", "0"}).run_cycles == 1);  // "forever" is announced, not run
  CHECK_THROWS_AS(parse({"allreduce", "-g", "x"}), Error);
  CHECK_THROWS_AS(parse({"allreduce", "-t", "0"}), Error);
  CHECK_THROWS_AS(parse({"allreduce", "-z", "4"}), Error);
  CHECK_THROWS_AS(parse({"allreduce", "-C", "2"}), Error);
}

TEST_CASE("-d all and -o all: nccl-tests' types and ops that Tutti has, in nccl-tests' order") {
  using Run = std::pair<DataType, ReduceOp>;
  CHECK(typeOpRuns(parse({"allreduce", "-d", "half", "-o", "max"})) ==
        std::vector<Run>{{DataType::kFloat16, ReduceOp::kMax}});
  const std::vector<Run> types = typeOpRuns(parse({"allgather", "-d", "all", "-o", "all"}));
  REQUIRE(types.size() == 8);  // allgather does not reduce: one op per type
  CHECK(types.front() == Run{DataType::kInt8, ReduceOp::kSum});
  CHECK(types.back() == Run{DataType::kBFloat16, ReduceOp::kSum});
  const std::vector<Run> all = typeOpRuns(parse({"allreduce", "--datatype=all", "--op=all"}));
  REQUIRE(all.size() == 40);
  CHECK(all[0] == Run{DataType::kInt8, ReduceOp::kSum});
  CHECK(all[1] == Run{DataType::kInt8, ReduceOp::kProduct});
  CHECK(all[4] == Run{DataType::kInt8, ReduceOp::kAverage});
  CHECK(all[5] == Run{DataType::kUInt8, ReduceOp::kSum});
  const std::vector<Run> ops = typeOpRuns(parse({"reducescatter", "-o", "all", "-d", "int32"}));
  REQUIRE(ops.size() == 5);
  CHECK(ops[2] == Run{DataType::kInt32, ReduceOp::kMax});
  CHECK_THROWS_AS(parse({"fusion", "-d", "all"}), Error);
  CHECK_THROWS_AS(parse({"latency", "-o", "all"}), Error);
  CHECK_THROWS_AS(parse({"allreduce", "-d", "uint32"}), Error);  // Tutti has no uint32
}

TEST_CASE("the table: nccl-tests' columns at their places, --baseline's after them") {
  for (bool baseline : {false, true}) {
    for (bool cputime : {false, true}) {
      INFO("baseline " << baseline << " cputime " << cputime);
      Metadata meta;
      meta.workload = "allreduce";
      meta.transport = "gloo";
      meta.backend = "shm";
      meta.ranks = 2;
      meta.cputime = cputime;
      FILE* f = std::tmpfile();
      REQUIRE(f != nullptr);
      Report report(meta, f);
      report.beginSweep(baseline);
      SweepRow row;
      row.bytes = 1024;
      row.count = 256;
      row.type = "float";
      row.redop = "sum";
      row.backend = "shm";
      row.out_of_place = {true, 10.0, 0.1024, 0.1024, 0, true, 5.0, 0.2048, 0};
      row.in_place = {true, 123456.0, 0.0512, 0.0512, 3, true, 40.0, 0.0256, 0};
      report.addSweepRow(row);
      report.finish(0);
      const std::vector<std::string> lines = printed(f);
      std::fclose(f);
      REQUIRE(lines.size() >= 7);
      CHECK(lines[0].find("backend shm (transport gloo)") != std::string::npos);
      // nccl-tests' header and a parser's view of it: '#' then 13 names.
      const char* time = cputime ? "cputime" : "time";
      std::vector<std::string> nccl = {"#", "size", "count", "type", "redop", "root",
                                       time, "algbw", "busbw", "#wrong",
                                       time, "algbw", "busbw", "#wrong"};
      if (baseline) {
        for (const char* extra : {"base_time", "base_bw", "ratio", "base_time", "base_bw", "ratio"})
          nccl.push_back(extra);
      }
      CHECK(words(lines[4]) == nccl);
      CHECK(lines[4].rfind("#       size         count      type   redop    root", 0) == 0);
      std::vector<std::string> cells = words(lines[6]);
      REQUIRE(cells.size() == (baseline ? 19u : 13u));
      CHECK(cells[0] == "1024");
      CHECK(cells[4] == "-1");
      CHECK(cells[5] == "10.00");   // out-of-place time, algbw, busbw, #wrong
      CHECK(cells[6] == "0.10");
      CHECK(cells[8] == "0");
      CHECK(cells[9] == "123456");  // in-place
      CHECK(cells[12] == "3");
      if (baseline) {
        CHECK(cells[13] == "5.00");  // out-of-place: bare time, busbw, ratio
        CHECK(cells[14] == "0.20");
        CHECK(cells[15] == "2.00");
        CHECK(cells[16] == "40.00");  // in-place
        CHECK(cells[18] == "3086.4");  // six characters, as nccl-tests fits them
      }
      // nccl-tests' fixed widths: the row's first 13 cells end where its header's do.
      const std::string& head = lines[4];
      const std::string& body = lines[6];
      CHECK(head.find("#wrong", head.find("#wrong") + 1) + 6 ==
            body.find(" 3") + 2);
    }
  }
  CHECK(fitNumber(1234567.0, 7) == "1234567");
  CHECK(fitNumber(12345678.0, 7) == "1.2e+07");
  CHECK(fitNumber(0.5, 6) == "  0.50");
}

TEST_CASE("the trailer names the backend of the rows the header's did not move") {
  Metadata meta;
  meta.workload = "broadcast";
  meta.backend = "shm";
  FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  Report report(meta, f);
  report.beginSweep(false);
  for (auto size_backend : {std::make_pair(8, "shm"), std::make_pair(64, "shm"),
                            std::make_pair(512, "mpi")}) {
    SweepRow row;
    row.bytes = size_backend.first;
    row.backend = size_backend.second;
    report.addSweepRow(row);
  }
  report.finish(0);
  std::string all;
  for (const std::string& l : printed(f)) all += l + "\n";
  std::fclose(f);
  CHECK(all.find("# Moved by             : shm 8..64 B, mpi 512..512 B\n") != std::string::npos);
  CHECK(report.json().find("\"backend\": \"mpi\"") != std::string::npos);
}
