// What the build-time kernel compiler emits for each generated kernel, and how those entries
// reach the runtime's registry. Generated registry sources include this header; nobody writes
// KernelVariant tables by hand.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "opforge/dtype.hpp"

struct halide_filter_metadata_t;

namespace opforge {

inline constexpr int kMaxCallExtents = 6;

struct AttrInfo {
  std::string name;
  bool integer = false;
};

// Parses an attribute spec, "alpha" or "stride_h:i,stride_w:i": ":i" marks an integer attribute.
// The DSL writes these specs and the runtime reads them back from the registry.
inline std::vector<AttrInfo> parse_attr_spec(const char* spec) {
  std::vector<AttrInfo> out;
  std::string s = spec ? spec : "";
  for (size_t pos = 0; pos < s.size();) {
    size_t end = std::min(s.find(',', pos), s.size());
    AttrInfo a{s.substr(pos, end - pos)};
    if (a.name.size() > 2 && a.name.compare(a.name.size() - 2, 2, ":i") == 0) {
      a.integer = true;
      a.name.resize(a.name.size() - 2);
    }
    out.push_back(a);
    pos = end + 1;
  }
  return out;
}

struct KernelVariant {
  const char* op;
  const char* family;     // elementwise, reduction, contraction, window, movement
  const char* dtype_key;  // "float32", or "float32_to_int64" for cast
  DType in_dtype, out_dtype;
  int num_inputs;
  const char* attrs;  // attribute spec, "alpha" or "stride_h:i,stride_w:i"
  int flags;          // family-specific kind (reduce/normalize, conv/pool, copy/gather)
  const char* variant;
  const char* target;  // CPU feature level: avx512, avx2, sse41
  int (*argv)(void**);
  const halide_filter_metadata_t* (*metadata)();
  int64_t min_extents[kMaxCallExtents];  // in the family's call extents; 0 = no minimum
};

// Adds generated kernels to the process-wide registry. Safe to call from static initialisers.
void register_kernels(const KernelVariant* variants, size_t count);

}  // namespace opforge
