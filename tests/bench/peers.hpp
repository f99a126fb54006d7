// The benchmarks behind `opforge bench`: opforge ops against what a user would otherwise call
// (OpenBLAS, oneDNN, memcpy as a bandwidth ceiling), all measured in one process so both sides
// see the same machine state.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace opforge::cli {

struct BenchOptions {
  std::string filter;             // ECMAScript regex searched in each benchmark's name; empty: all
  int repeats = 7;                // timed repeats per side; the median is reported
  double repeat_seconds = 0.075;  // each repeat runs enough calls to last about this long
  // Called with a benchmark's name before it starts, for progress output; may be empty.
  std::function<void(const std::string&)> on_start;
};

struct BenchResult {
  std::string name;
  std::string unit;  // "GFLOP/s" or "GB/s" (higher is better), "us/call" (lower is better)
  double ours = 0;
  std::string peer_name;  // "none" when the peer library was not built in
  double peer = 0;
  double ratio = 0;     // > 1: opforge is better; 0 when there is no peer figure
  std::string variant;  // the kernel variant(s) the dispatcher ran most, "op/variant"
};

// True for throughput units, false for time units ("us/call").
bool higher_is_better(const std::string& unit);

std::vector<std::string> benchmark_names();

// Runs the benchmarks whose names match options.filter, in a fixed order. Throws an Error for an
// invalid filter, a filter that matches nothing, or results that disagree with the peer's.
std::vector<BenchResult> run_benchmarks(const BenchOptions& options);

}  // namespace opforge::cli
