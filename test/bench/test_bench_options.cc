// tutti-bench's pure parts: flags and size suffixes, the sweep, the table's arithmetic, the
// reference data and the JSON document. No processes, no runtime.
#include "bench/data.h"
#include "bench/elements.h"
#include "bench/error.h"
#include "bench/options.h"
#include "bench/report.h"

#include "test/bench/parse_args.h"
#include "test/catch.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

using namespace tutti;
using namespace tutti::bench;

TEST_CASE("parseSize reads nccl-tests' suffixes as powers of 1024") {
  CHECK(parseSize("0", "-b") == 0);
  CHECK(parseSize("8", "-b") == 8);
  CHECK(parseSize("1K", "-b") == 1024);
  CHECK(parseSize("256k", "-b") == 256 * 1024);
  CHECK(parseSize("16M", "-e") == 16ll << 20);
  CHECK(parseSize("3m", "-e") == 3ll << 20);
  CHECK(parseSize("1G", "-e") == 1ll << 30);
  CHECK(parseSize("2GiB", "-e") == 2ll << 30);
  CHECK(parseSize("64KB", "-e") == 64 << 10);
  CHECK(parseSize("12b", "-e") == 12);
  CHECK(parseSize("1.5M", "-e") == 3ll << 19);  // nccl-tests reads a double
  CHECK(parseSize("0.5K", "-e") == 512);
  CHECK(parseSize("8589934591G", "-e") == 8589934591ll << 30);  // largest that fits
}

TEST_CASE("parseSize rejects junk with the flag and the text in the message") {
  for (const char* bad : {"", "K", "-1", "1T", "1KK", "1.5.1M", ".5M", " 1", "1 ", "0x10", "8589934592G",
                          "99999999999999999999"}) {
    INFO("text '" << bad << "'");
    try {
      parseSize(bad, "-b");
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == StatusCode::kInvalidArgument);
      CHECK(std::string(e.what()).find("-b '" + std::string(bad) + "'") != std::string::npos);
    }
  }
}

TEST_CASE("dtype and reduce-op names: nccl-tests' and Tutti's") {
  CHECK(parseDataType("float") == DataType::kFloat32);
  CHECK(parseDataType("half") == DataType::kFloat16);
  CHECK(parseDataType("bfloat16") == DataType::kBFloat16);
  CHECK(parseDataType("double") == DataType::kFloat64);
  CHECK(parseDataType("int8") == DataType::kInt8);
  CHECK(parseDataType("uint8") == DataType::kUInt8);
  CHECK(parseDataType("int32") == DataType::kInt32);
  CHECK(parseDataType("int64") == DataType::kInt64);
  CHECK(parseDataType("bool") == DataType::kBool);
  CHECK(parseDataType("bf16") == DataType::kBFloat16);
  CHECK_THROWS_AS(parseDataType("quad"), Error);
  CHECK(parseReduceOp("sum") == ReduceOp::kSum);
  CHECK(parseReduceOp("prod") == ReduceOp::kProduct);
  CHECK(parseReduceOp("avg") == ReduceOp::kAverage);
  CHECK(parseReduceOp("min") == ReduceOp::kMin);
  CHECK(parseReduceOp("max") == ReduceOp::kMax);
  CHECK_THROWS_AS(parseReduceOp("xor"), Error);
  CHECK(std::string(ncclTypeName(DataType::kFloat16)) == "half");
  CHECK(std::string(ncclOpName(ReduceOp::kProduct)) == "prod");
}

TEST_CASE("parseOptions: nccl-tests' defaults and flags") {
  Options o = parse({"allreduce"});
  CHECK(o.workload == Workload::kAllreduce);
  CHECK(o.min_bytes == 32ll << 20);
  CHECK(o.max_bytes == 32ll << 20);
  CHECK(o.iters == 20);
  CHECK(o.warmup_iters == 5);
  CHECK(o.step_factor == 1.0);  // nccl-tests': -i's 1M is added each step
  CHECK(o.step_bytes == 1 << 20);
  CHECK(o.run_cycles == 1);
  CHECK(o.notices.empty());
  CHECK(o.check);
  CHECK(o.combine == TimeCombine::kAverage);
  CHECK_FALSE(o.baseline);
  REQUIRE(o.fusion_configs.size() == 2);
  CHECK(o.fusion_configs[0] == std::make_pair(256, int64_t{4096}));
  CHECK(o.fusion_configs[1] == std::make_pair(64, int64_t{256 << 10}));

  o = parse({"broadcast", "-b", "8", "-e", "128M", "-f", "4", "-n", "7", "-w", "0", "-c", "0",
             "-d", "half", "-o", "max", "-r", "1", "-a", "3", "--baseline", "--json", "x.json"});
  CHECK(o.workload == Workload::kBroadcast);
  CHECK(o.min_bytes == 8);
  CHECK(o.max_bytes == 128ll << 20);
  CHECK(o.step_factor == 4.0);
  CHECK(o.iters == 7);
  CHECK(o.warmup_iters == 0);
  CHECK_FALSE(o.check);
  CHECK(o.dtype == DataType::kFloat16);
  CHECK(o.op == ReduceOp::kMax);
  CHECK(o.root == 1);
  CHECK(o.combine == TimeCombine::kMax);
  CHECK(o.baseline);
  CHECK(o.json_path == "x.json");

  o = parse({"latency"});
  CHECK(o.min_bytes == 4);
  CHECK(o.max_bytes == 4);
  CHECK(o.iters == 1000);

  o = parse({"fusion", "--tensors", "8", "--tensor-bytes", "1K"});
  REQUIRE(o.fusion_configs.size() == 1);
  CHECK(o.fusion_configs[0] == std::make_pair(8, int64_t{1024}));

  o = parse({"allgather", "-b", "1K"});  // -b alone raises -e to it
  CHECK(o.min_bytes == 1024);
  CHECK(o.max_bytes == 32ll << 20);
  o = parse({"allgather", "-b", "64M"});
  CHECK(o.max_bytes == 64ll << 20);
}

TEST_CASE("parseOptions rejects what nccl-tests would not run") {
  CHECK_THROWS_AS(parse({}), Error);                                  // no workload
  CHECK_THROWS_AS(parse({"allreduce", "allgather"}), Error);          // two workloads
  CHECK_THROWS_AS(parse({"reduce"}), Error);                          // unknown workload
  CHECK_THROWS_AS(parse({"allreduce", "-b", "1M", "-e", "1K"}), Error);
  CHECK_THROWS_AS(parse({"allreduce", "-n", "0"}), Error);
  CHECK_THROWS_AS(parse({"allreduce", "-a", "4"}), Error);
  CHECK_THROWS_AS(parse({"allreduce", "-f", "-2"}), Error);
  CHECK_THROWS_AS(parse({"allreduce", "-b", "1K", "-e", "2K", "-i", "0"}), Error);  // no step
  CHECK_THROWS_AS(parse({"allreduce", "-b", "0", "-e", "1G", "-i", "1"}), Error);   // 2^30 sizes
  CHECK_THROWS_AS(parse({"allreduce", "-n"}), Error);                 // missing value
  CHECK_THROWS_AS(parse({"allreduce", "--bogus", "1"}), Error);
  CHECK_THROWS_AS(parse({"fusion", "--tensors", "8"}), Error);        // needs --tensor-bytes
  CHECK(parse({"allreduce", "-h"}).help);
}

TEST_CASE("sweepSizes steps like nccl-tests") {
  Options o;
  o.step_factor = 2;
  o.min_bytes = 8;
  o.max_bytes = 128;
  CHECK(sweepSizes(o) == std::vector<int64_t>{8, 16, 32, 64, 128});
  o.max_bytes = 100;  // the last size never exceeds -e
  CHECK(sweepSizes(o) == std::vector<int64_t>{8, 16, 32, 64});
  o.step_factor = 1;
  o.step_bytes = 40;
  CHECK(sweepSizes(o) == std::vector<int64_t>{8, 48, 88});
  o.step_factor = 2;
  o.min_bytes = 0;
  o.max_bytes = 4;
  CHECK(sweepSizes(o) == std::vector<int64_t>{0, 1, 2, 4});
  o.min_bytes = o.max_bytes = 1 << 20;
  CHECK(sweepSizes(o) == std::vector<int64_t>{1 << 20});
}

TEST_CASE("bus bandwidth factors are nccl-tests'") {
  CHECK(busBandwidthFactor("allreduce", 4) == Approx(1.5));
  CHECK(busBandwidthFactor("allreduce", 2) == Approx(1.0));
  CHECK(busBandwidthFactor("allgather", 4) == Approx(0.75));
  CHECK(busBandwidthFactor("reducescatter", 3) == Approx(2.0 / 3));
  CHECK(busBandwidthFactor("alltoall", 2) == Approx(0.5));
  CHECK(busBandwidthFactor("broadcast", 4) == Approx(1.0));
  CHECK(formatTime(12.345) == "12.35");
  CHECK(formatTime(12345.6) == "12345.6");
  CHECK(formatTime(1234567.0) == "1234567");
}

TEST_CASE("latencyStats: median, p99 and max") {
  std::vector<double> s;
  for (int i = 100; i >= 1; --i) s.push_back(i);
  LatencyStats st = latencyStats(&s);
  CHECK(st.median_us == Approx(50.5));
  CHECK(st.p99_us == Approx(99));
  CHECK(st.max_us == Approx(100));
  std::vector<double> one = {7};
  CHECK(latencyStats(&one).p99_us == 7);
}

TEST_CASE("reference data: every dtype and op, odd rank counts") {
  const DataType dtypes[] = {DataType::kUInt8,   DataType::kInt8,     DataType::kInt32,
                             DataType::kInt64,   DataType::kFloat16,  DataType::kBFloat16,
                             DataType::kFloat32, DataType::kFloat64,  DataType::kBool};
  for (DataType dt : dtypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (int n : {1, 2, 3, 4}) {
        INFO(dataTypeName(dt) << " " << ncclOpName(op) << " n=" << n);
        const int64_t count = 37;
        std::vector<char> acc(count * 8), in(count * 8), exp(count * 8);
        fillInput(acc.data(), count, dt, op, 0, 5);
        for (int r = 1; r < n; ++r) {
          fillInput(in.data(), count, dt, op, r, 5);
          for (int64_t i = 0; i < count; ++i) {
            double a = loadValue(acc.data(), i, dt), b = loadValue(in.data(), i, dt);
            double v = op == ReduceOp::kMin ? std::min(a, b)
                       : op == ReduceOp::kMax ? std::max(a, b)
                       : op == ReduceOp::kSum ? (dt == DataType::kBool ? std::max(a, b) : a + b)
                       : (dt == DataType::kBool ? std::min(a, b) : a * b);
            storeValue(acc.data(), i, dt, v);
          }
        }
        fillReduced(exp.data(), count, dt, op, n, 5);
        CHECK(countWrong(acc.data(), exp.data(), count, dt) == 0);
        // One flipped element is caught.
        storeValue(acc.data(), 11, dt, loadValue(acc.data(), 11, dt) == 0 ? 1 : 0);
        CHECK(countWrong(acc.data(), exp.data(), count, dt) == 1);
      }
    }
  }
  // Ranks differ, so a broadcast or gather that returns the wrong rank's data is caught.
  std::vector<float> a(64), b(64);
  fillInput(a.data(), 64, DataType::kFloat32, ReduceOp::kSum, 0, 0);
  fillInput(b.data(), 64, DataType::kFloat32, ReduceOp::kSum, 1, 0);
  CHECK(countWrong(a.data(), b.data(), 64, DataType::kFloat32) > 0);
  // Average: integers truncate toward zero (10/4 -> 2), floats keep the fraction.
  std::vector<int32_t> avg(16);
  fillReduced(avg.data(), 16, DataType::kInt32, ReduceOp::kAverage, 4, 0);
  std::vector<float> favg(16);
  fillReduced(favg.data(), 16, DataType::kFloat32, ReduceOp::kAverage, 4, 0);
  for (int i = 0; i < 16; ++i) {
    double sum = 0;
    for (int r = 0; r < 4; ++r) sum += inputValue(r, i, ReduceOp::kAverage, DataType::kInt32);
    CHECK(avg[i] == static_cast<int32_t>(sum / 4));
    CHECK(favg[i] == Approx(sum / 4));
  }
}

TEST_CASE("the bench's own 16-bit floats: IEEE half and bfloat16, nearest-even") {
  // float16: normals, the largest finite, subnormals, signed zero, inf and NaN.
  CHECK(floatToHalf(1.0f) == 0x3c00);
  CHECK(floatToHalf(-2.5f) == 0xc100);
  CHECK(floatToHalf(65504.0f) == 0x7bff);
  CHECK(floatToHalf(65520.0f) == 0x7c00);                   // rounds up to inf
  CHECK(floatToHalf(std::ldexp(1.0f, -24)) == 0x0001);      // smallest subnormal
  CHECK(floatToHalf(std::ldexp(1.0f, -25)) == 0x0000);      // tie: to even (zero)
  CHECK(floatToHalf(std::ldexp(3.0f, -25)) == 0x0002);      // tie: to even (2)
  CHECK(floatToHalf(std::ldexp(1.0f, -14)) == 0x0400);      // smallest normal
  CHECK(floatToHalf(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);                // tie down
  CHECK(floatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);            // tie up
  CHECK(floatToHalf(2047.0f / 1024.0f + std::ldexp(1.0f, -11)) == 0x4000);   // carry
  CHECK(floatToHalf(-0.0f) == 0x8000);
  CHECK((floatToHalf(std::nanf("")) & 0x7fff) > 0x7c00);
  CHECK(halfToFloat(0x3c00) == 1.0f);
  CHECK(halfToFloat(0x7bff) == 65504.0f);
  CHECK(halfToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(halfToFloat(0x83ff) == -std::ldexp(1023.0f, -24));
  CHECK(std::isinf(halfToFloat(0xfc00)));
  CHECK(std::isnan(halfToFloat(0x7e00)));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every finite half reads back to itself
    if ((h & 0x7c00) == 0x7c00) continue;
    INFO("half 0x" << std::hex << h);
    REQUIRE(floatToHalf(halfToFloat(static_cast<uint16_t>(h))) == h);
  }
  // bfloat16: the top half of a float, rounded to nearest-even.
  CHECK(floatToBfloat16(1.0f) == 0x3f80);
  CHECK(floatToBfloat16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);       // tie down
  CHECK(floatToBfloat16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);   // tie up
  CHECK(floatToBfloat16(3.0e38f * 1.2f) == 0x7f80);                    // inf stays inf
  CHECK((floatToBfloat16(std::nanf("")) & 0x7fff) > 0x7f80);
  CHECK(bfloat16ToFloat(0xc040) == -3.0f);
  // Reductions and the average's scale on them, and on integers (wrapping, truncating).
  uint16_t acc[2] = {floatToHalf(1.5f), floatToHalf(-4.0f)};
  const uint16_t in[2] = {floatToHalf(2.0f), floatToHalf(3.0f)};
  reduceInto(acc, in, 2, DataType::kFloat16, ReduceOp::kSum);
  CHECK(halfToFloat(acc[0]) == 3.5f);
  CHECK(halfToFloat(acc[1]) == -1.0f);
  reduceInto(acc, in, 2, DataType::kFloat16, ReduceOp::kMax);
  CHECK(halfToFloat(acc[0]) == 3.5f);
  CHECK(halfToFloat(acc[1]) == 3.0f);
  scaleInPlace(acc, 2, DataType::kFloat16, 0.5);
  CHECK(halfToFloat(acc[0]) == 1.75f);
  int8_t i8[2] = {120, -7};
  const int8_t j8[2] = {10, 2};
  reduceInto(i8, j8, 2, DataType::kInt8, ReduceOp::kSum);
  CHECK(i8[0] == -126);  // wraps
  scaleInPlace(i8, 2, DataType::kInt8, 0.25);
  CHECK(i8[0] == -31);   // truncated toward zero
  CHECK(i8[1] == -1);
  uint8_t b[3] = {1, 0, 0};
  const uint8_t c[3] = {1, 1, 0};
  reduceInto(b, c, 3, DataType::kBool, ReduceOp::kProduct);
  CHECK((b[0] == 1 && b[1] == 0 && b[2] == 0));
}

TEST_CASE("the report's JSON holds the rows and metadata") {
  Metadata meta;
  meta.workload = "allreduce";
  meta.command = "tutti-bench allreduce \"quoted\"";
  meta.backend = "mpi";
  meta.baseline = "mpi";
  meta.ranks = 2;
  fillMachine(&meta);
  Report report(meta, nullptr);
  report.beginSweep(true);
  SweepRow row;
  row.bytes = 1024;
  row.count = 256;
  row.type = "float";
  row.redop = "sum";
  row.out_of_place = {true, 10.0, 0.1024, 0.1024, 0, true, 5.0, 0.2048, 0};
  row.in_place = {true, 20.0, 0.0512, 0.0512, 0, false, 0, 0, -1};
  report.addSweepRow(row);
  report.finish(0);
  CHECK(report.averageBusBandwidth() == Approx(0.0768));
  const std::string js = report.json();
  CHECK(js.find("\"rows\": [") != std::string::npos);
  CHECK(js.find("\"size\": 1024") != std::string::npos);
  CHECK(js.find("\"ratio\": 2") != std::string::npos);
  CHECK(js.find("\"ranks\": 2") != std::string::npos);
  CHECK(js.find("\\\"quoted\\\"") != std::string::npos);
  CHECK(js.find("\"date\": \"20") != std::string::npos);
}
