// Clock and statistics shared by the benchmarks: medians, because the machine is shared and noisy.
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

namespace opforge::cli {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace opforge::cli
