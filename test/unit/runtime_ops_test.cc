// Every op through the runtime with threads as ranks: data movement, join, process sets.
#include "test/unit/rank_threads.h"

#include "test/catch.h"

#include <cstdlib>

using namespace tutti;
using namespace tutti::test;

TEST_CASE("broadcast from every root, allgather with uneven first dimensions") {
  for (int n : {1, 2, 3, 4}) {
    Failures failures;
    runRanks(n, [](RankContext& c) {
      for (int root = 0; root < c.size; ++root) {
        std::vector<int64_t> buf(7, c.rank == root ? 100 + root : -1);
        TensorEntry e = makeTestEntry(OpType::kBroadcast, "bc" + std::to_string(root), {7}, DataType::kInt64, buf.data(), buf.data());
        e.request.root = root;
        c.expectOk(runOne(c.rt, std::move(e)), "broadcast");
        if (buf[6] != 100 + root) c.fail("broadcast root " + std::to_string(root) + " got " + std::to_string(buf[6]));
      }
      // Rank r contributes r rows (rank 0 none) of 3 int16s valued r*10+column.
      std::vector<int16_t> mine(c.rank * 3);
      for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<int16_t>(c.rank * 10 + i % 3);
      Result result;
      c.expectOk(runOne(c.rt, makeTestEntry(OpType::kAllgather, "ag", {c.rank, 3}, DataType::kInt16, mine.data(), nullptr), &result), "allgather");
      int64_t rows = c.size * (c.size - 1) / 2;
      if (result.shape != std::vector<int64_t>{rows, 3}) c.fail("allgather shape " + shapeString(result.shape));
      auto* out = static_cast<int16_t*>(result.data);
      int64_t row = 0;
      for (int r = 0; r < c.size; ++r)
        for (int k = 0; k < r; ++k, ++row)
          for (int col = 0; col < 3; ++col)
            if (out[row * 3 + col] != r * 10 + col) {
              c.fail("allgather row " + std::to_string(row));
              r = c.size;
              break;
            }
      std::free(result.data);
    }, failures);
    INFO("world size " << n);
    CHECK(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("alltoall with uneven and empty splits, reducescatter with uneven rows") {
  for (int n : {1, 2, 3, 4}) {
    Failures failures;
    runRanks(n, [](RankContext& c) {
      // Rank r sends (r + j) % 3 rows to rank j; each row holds [sender, receiver].
      std::vector<int64_t> splits(c.size);
      std::vector<int32_t> send;
      for (int j = 0; j < c.size; ++j) {
        splits[j] = (c.rank + j) % 3;
        for (int64_t k = 0; k < splits[j]; ++k) send.insert(send.end(), {c.rank, j});
      }
      TensorEntry e = makeTestEntry(OpType::kAlltoall, "a2a", {static_cast<int64_t>(send.size() / 2), 2}, DataType::kInt32, send.data(), nullptr);
      e.request.splits = splits;
      Result result;
      c.expectOk(runOne(c.rt, std::move(e), &result), "alltoall");
      auto* got = static_cast<int32_t*>(result.data);
      int64_t row = 0;
      for (int j = 0; j < c.size; ++j) {
        if (result.recv_splits.size() != static_cast<size_t>(c.size) || result.recv_splits[j] != (j + c.rank) % 3) {
          c.fail("alltoall recv_splits wrong");
          break;
        }
        for (int64_t k = 0; k < result.recv_splits[j]; ++k, ++row)
          if (got[row * 2] != j || got[row * 2 + 1] != c.rank) c.fail("alltoall row " + std::to_string(row));
      }
      std::free(result.data);

      // reducescatter of 2n+1 rows x 2 columns, value = rank + row: sum over ranks.
      const int64_t rows = 2 * c.size + 1;
      std::vector<float> in(rows * 2);
      for (int64_t i = 0; i < rows * 2; ++i) in[i] = static_cast<float>(c.rank + i / 2);
      TensorEntry rs = makeTestEntry(OpType::kReducescatter, "rs", {rows, 2}, DataType::kFloat32, in.data(), nullptr);
      rs.request.reduce_op = ReduceOp::kAverage;
      c.expectOk(runOne(c.rt, std::move(rs), &result), "reducescatter");
      int64_t my_rows = rows / c.size + (c.rank < rows % c.size ? 1 : 0);
      int64_t first = 0;
      for (int r = 0; r < c.rank; ++r) first += rows / c.size + (r < rows % c.size ? 1 : 0);
      if (result.shape != std::vector<int64_t>{my_rows, 2}) c.fail("reducescatter shape " + shapeString(result.shape));
      auto* out = static_cast<float*>(result.data);
      for (int64_t i = 0; i < my_rows * 2; ++i) {
        float expected = static_cast<float>(first + i / 2) + (c.size - 1) / 2.0f;
        if (out[i] != expected) {
          c.fail("reducescatter element " + std::to_string(i) + " = " + std::to_string(out[i]) + ", expected " + std::to_string(expected));
          break;
        }
      }
      std::free(result.data);
    }, failures);
    INFO("world size " << n);
    CHECK(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("grouped allreduce completes under one handle") {
  Failures failures;
  runRanks(3, [](RankContext& c) {
    std::vector<std::vector<double>> bufs = {std::vector<double>(3, c.rank), std::vector<double>(1, 1.0)};
    std::vector<TensorEntry> entries;
    entries.push_back(makeTestEntry(OpType::kAllreduce, "g.a", {3}, DataType::kFloat64, bufs[0].data(), bufs[0].data()));
    entries.push_back(makeTestEntry(OpType::kAllreduce, "g.b", {1}, DataType::kFloat64, bufs[1].data(), bufs[1].data()));
    Handle h;
    c.expectOk(c.rt.submit(0, std::move(entries), nullptr, &h), "grouped submit");
    c.expectOk(c.rt.wait(h, 30, nullptr), "grouped wait");
    if (bufs[0][2] != 3.0 || bufs[1][0] != 3.0) c.fail("grouped results");
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
}

TEST_CASE("a fused batch goes straight between tensors and shared memory unless they overlap") {
  // Steps of one grouped allreduce (average, then postscaled sum) of three tensors in one
  // buffer: apart (out of place and in place), then with the third tensor's output over the
  // first one's input (the fusion buffer's path: the shm backend's pieces would write one
  // chunk's outputs before reading the next chunk's inputs). Each step repeats (a cache hit the second
  // time) and every result is checked on every rank.
  for (int n : {2, 3}) {
    Failures failures;
    runRanks(n, [n](RankContext& c) {
      for (int step = 0; step < 6; ++step) {
        const bool overlap = step >= 4, average = step % 2 == 0;
        std::vector<double> mem(64, 0.0);
        double* a_in = mem.data();        // 8 elements
        double* b_in = mem.data() + 8;    // 8 elements, in place
        double* c_in = mem.data() + 16;   // 4 elements
        double* a_out = mem.data() + 32;  // apart from every input...
        double* c_out = mem.data() + 48;
        if (overlap) c_out = mem.data() + 4;  // ...or over a's input (its last 4 elements)
        for (int i = 0; i < 8; ++i) a_in[i] = b_in[i] = (c.rank + 1) * 10 + i;
        for (int i = 0; i < 4; ++i) c_in[i] = (c.rank + 1) * 100 + i;
        std::vector<TensorEntry> entries;
        entries.push_back(makeTestEntry(OpType::kAllreduce, "o.a", {8}, DataType::kFloat64, a_in, a_out));
        entries.push_back(makeTestEntry(OpType::kAllreduce, "o.b", {8}, DataType::kFloat64, b_in, b_in));
        entries.push_back(makeTestEntry(OpType::kAllreduce, "o.c", {4}, DataType::kFloat64, c_in, c_out));
        for (auto& e : entries) {
          e.request.reduce_op = average ? ReduceOp::kAverage : ReduceOp::kSum;
          e.request.postscale = average ? 1.0 : 0.5;
        }
        Handle h;
        c.expectOk(c.rt.submit(0, std::move(entries), nullptr, &h), "submit");
        c.expectOk(c.rt.wait(h, 30, nullptr), "wait");
        const double ranks_sum = n * (n + 1) / 2.0, scale = average ? 1.0 / n : 0.5;
        for (int i = 0; i < 8; ++i) {
          const double want = (ranks_sum * 10 + n * i) * scale;
          if (a_out[i] != want || b_in[i] != want)
            return c.fail("step " + std::to_string(step) + " element " + std::to_string(i) +
                          ": a " + std::to_string(a_out[i]) + ", b " + std::to_string(b_in[i]) +
                          ", expected " + std::to_string(want));
        }
        for (int i = 0; i < 4; ++i)
          if (c_out[i] != (ranks_sum * 100 + n * i) * scale)
            return c.fail("step " + std::to_string(step) + ": c[" + std::to_string(i) + "] = " +
                          std::to_string(c_out[i]));
        // Only the overlapping batches are packed into the fusion buffer.
        int64_t pack_ns = -1;
        for (const auto& kv : c.rt.stats())
          if (kv.first == "time.pack_ns") pack_ns = kv.second;
        if ((pack_ns > 0) != overlap)
          return c.fail("step " + std::to_string(step) + ": time.pack_ns " +
                        std::to_string(pack_ns));
      }
    }, failures);
    INFO("world size " << n);
    CHECK(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("barrier and join: joined ranks contribute zeros, average divides by the full size") {
  for (int n : {2, 3, 4}) {
    Failures failures;
    runRanks(n, [](RankContext& c) {
      Handle h;
      c.expectOk(c.rt.submit(0, [] { std::vector<TensorEntry> v(1); v[0].request.op = OpType::kBarrier; return v; }(), nullptr, &h), "barrier");
      c.expectOk(c.rt.wait(h, 30, nullptr), "barrier wait");
      // Rank r runs r + 1 steps, then joins: step s is reduced over ranks >= s.
      for (int step = 0; step <= c.rank; ++step) {
        std::vector<float> x(5, 1.0f);
        TensorEntry e = makeTestEntry(OpType::kAllreduce, "step" + std::to_string(step), {5}, DataType::kFloat32, x.data(), x.data());
        e.request.reduce_op = ReduceOp::kAverage;
        c.expectOk(runOne(c.rt, std::move(e)), "step");
        float expected = static_cast<float>(c.size - step) / c.size;
        if (x[4] != expected) c.fail("step " + std::to_string(step) + ": " + std::to_string(x[4]) + " expected " + std::to_string(expected));
      }
      if (c.rank == c.size - 1 && c.size > 1) {  // the others have joined: allgather is an error
        std::vector<float> x(1);
        Status s = runOne(c.rt, makeTestEntry(OpType::kAllgather, "ag-after-join", {1}, DataType::kFloat32, x.data(), nullptr));
        if (s.code() != StatusCode::kJoined) c.fail("allgather after join: " + s.message());
      }
      std::vector<TensorEntry> join(1);
      join[0].request.op = OpType::kJoin;
      c.expectOk(c.rt.submit(0, std::move(join), nullptr, &h), "join");
      Result result;
      c.expectOk(c.rt.wait(h, 30, &result), "join wait");
      if (result.last_joined_rank != c.size - 1) c.fail("last joined " + std::to_string(result.last_joined_rank));
      std::vector<float> y(2, 1.0f);  // normal work after everyone joined
      c.expectOk(runOne(c.rt, makeTestEntry(OpType::kAllreduce, "after-join", {2}, DataType::kFloat32, y.data(), y.data())), "after join");
      if (y[0] != c.size) c.fail("after join " + std::to_string(y[0]));
    }, failures);
    INFO("world size " << n);
    CHECK(failures.summary() == "0 failure(s)");
  }
}

TEST_CASE("process sets: even and odd ranks work side by side; errors for outsiders and disagreement") {
  Failures failures;
  runRanks(4, [](RankContext& c) {
    int evens = -1, odds = -1;
    c.expectOk(c.rt.addProcessSet({0, 2}, &evens), "add evens");
    c.expectOk(c.rt.addProcessSet({1, 3}, &odds), "add odds");
    if (evens != 1 || odds != 2) c.fail("ids " + std::to_string(evens) + "," + std::to_string(odds));
    int mine = c.rank % 2 == 0 ? evens : odds;
    int other = c.rank % 2 == 0 ? odds : evens;
    for (int step = 0; step < 20; ++step) {
      std::vector<int32_t> x(3, c.rank);
      c.expectOk(runOne(c.rt, makeTestEntry(OpType::kAllreduce, "ps" + std::to_string(step), {3}, DataType::kInt32, x.data(), x.data()), nullptr, mine), "set allreduce");
      int expected = c.rank % 2 == 0 ? 2 : 4;
      if (x[0] != expected) c.fail("set allreduce " + std::to_string(x[0]));
    }
    std::vector<int32_t> x(3);
    Handle h;
    Status s = submitOne(c.rt, makeTestEntry(OpType::kAllreduce, "outsider", {3}, DataType::kInt32, x.data(), x.data()), &h, other);
    if (s.code() != StatusCode::kInvalidArgument || s.message().find("is not a member of process set") == std::string::npos)
      c.fail("outsider: " + s.message());
    int bad = -1;
    s = c.rt.addProcessSet(c.rank == 0 ? std::vector<int>{0, 1} : std::vector<int>{0, 1, 2}, &bad);
    if (s.code() != StatusCode::kMismatch) c.fail("disagreeing sets: " + s.message());
    c.expectOk(c.rt.removeProcessSet(evens), "remove");
    if (!c.rt.processSetRanks(evens).empty()) c.fail("removed set still listed");
    std::vector<float> y(1, 1.0f);
    c.expectOk(runOne(c.rt, makeTestEntry(OpType::kAllreduce, "global-after", {1}, DataType::kFloat32, y.data(), y.data())), "global after sets");
    if (y[0] != 4.0f) c.fail("global after sets " + std::to_string(y[0]));
  }, failures);
  CHECK(failures.summary() == "0 failure(s)");
}
