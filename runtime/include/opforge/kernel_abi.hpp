// The contract between the DSL, the build-time kernel compiler and the runtime: what the compiler
// emits for each generated kernel (its buffers and their roles, its scalar parameters, its variant
// and entry point, the call extents it accepts) and how those entries reach the runtime's
// registry. Generated registry sources include this header; nobody writes KernelVariant tables by
// hand.
//
// A kernel's argv entry point takes, in this order: its Halide user context; the buffers it reads
// (role input or inout) in declared order; its scalar parameters (the attribute spec's order,
// float64 or int32); the buffers it writes (role output or inout) in declared order. An inout
// buffer is one halide_buffer_t passed twice: read and written in place.
//
// Elementwise kernels read each element of an input before they write that element of an output
// and write each output element once (no ShiftInwards tails: schedules/alias_safe.hpp), so an
// output may be the very same view as an input; any other overlap the runtime resolves first.
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

// How a kernel uses a buffer.
enum class BufferRole : uint8_t { input, output, inout };

inline constexpr const char* role_name(BufferRole r) {
  return r == BufferRole::input ? "input" : r == BufferRole::output ? "output" : "inout";
}
inline constexpr bool reads(BufferRole r) { return r != BufferRole::output; }
inline constexpr bool writes(BufferRole r) { return r != BufferRole::input; }

// One buffer of a kernel, in declared order.
struct BufferSpec {
  const char* name;
  BufferRole role;
  DType dtype;
  int dims;  // the rank of the kernel's canonical view
};

// At most this many buffers per kernel (the runtime's argument packing holds them inline).
inline constexpr int kMaxKernelBuffers = 8;

// The op that computes elementwise op `op`'s gradients: its inputs, then the gradient of its
// result, in; the gradient of each non-bool input out, in input order, all of one shape.
inline std::string backward_name(const std::string& op) { return op + "_backward"; }

// A generated kernel's argv entry point.
using KernelEntry = int (*)(void**);

struct KernelVariant {
  const char* op;
  const char* family;     // elementwise, reduction, contraction, window, movement
  const char* dtype_key;  // "float32", or "float32_to_int64" for cast
  DType in_dtype, out_dtype;
  const BufferSpec* buffers;  // in declared order
  int num_buffers;
  const char* attrs;  // attribute spec, "alpha" or "stride_h:i,stride_w:i"
  int flags;          // family-specific kind (reduce/normalize, conv/pool, copy/gather)
  const char* variant;
  const char* target;  // CPU feature level: avx512, avx2, sse41
  KernelEntry argv;
  const halide_filter_metadata_t* (*metadata)();
  int64_t min_extents[kMaxCallExtents];  // in the family's call extents; 0 = no minimum
  // The manual CPU kernel of an elementwise op has a dense companion: the same op and schedule
  // branch over one contiguous dimension, its buffers passed with dimensions = 1 (the first of
  // their dims). The runtime calls it when every buffer of a call is contiguous; it skips the
  // strided kernel's checks of six dimensions, most of a tiny call's time. Null: none.
  KernelEntry dense_argv = nullptr;
};

// Adds generated kernels to the process-wide registry. Safe to call from static initialisers.
void register_kernels(const KernelVariant* variants, size_t count);

}  // namespace opforge
