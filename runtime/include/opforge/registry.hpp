// The registry of generated kernels, grouped as op -> dtype -> variants, and what the command line
// and tests read from it. Filled by the generated registry sources (kernel_abi.hpp), and by any
// later register_kernels() call; for each variant the best CPU feature level this machine supports
// is kept. Readers see a published snapshot without taking a lock; what they get stays valid.
#pragma once
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "opforge/device.hpp"
#include "opforge/kernel_abi.hpp"
#include "opforge/variant_set.hpp"

namespace opforge {

struct VariantInfo {
  std::string name;
  const KernelVariant* kernel;        // CPU variants: at the best target this CPU supports
  DeviceKind kind = DeviceKind::cpu;  // the kind of device it runs on
  int num_extents = 0;
  bool has_minimum() const;
};

struct OpInfo;

// All variants of one op at one dtype signature: what the dispatcher chooses among.
struct KernelGroup {
  const OpInfo* op = nullptr;
  std::string dtype_key;
  DType in_dtype, out_dtype;
  std::vector<VariantInfo> variants;
  std::vector<BufferSpec> buffers;  // the kernels' buffers in declared order (kernel_abi.hpp)
  uint32_t id = 0;                  // dense index, for the performance model's keys
  // The variants that run on each device kind (indexed by DeviceKind).
  VariantSet kind_variants[3];
  // The variants that accept every call whose extents are all at least 1 (most have no minimum),
  // so that such a call compares its extents only with the variants that do.
  VariantSet any_extents;
  // Some variant has a dense companion (kernel_abi.hpp): the placement model then keeps contiguous
  // calls apart from strided ones of the same extents, since they run other code.
  bool has_dense = false;
};

struct OpInfo {
  std::string name, family;
  int num_inputs = 0;       // buffers the kernels read: role input or inout
  int num_outputs = 0;      // buffers they only write: role output
  uint32_t inout_mask = 0;  // the inputs written in place (bit i: input i)
  int flags = 0;
  std::vector<AttrInfo> attrs;
  std::map<std::string, KernelGroup> groups;  // by dtype key
  // The group of a one-dtype key ("float32"), by DType: the call path's lookup, without strings.
  const KernelGroup* by_dtype[std::size(kAllDTypes)] = {};
  const KernelGroup* find_group(DType d) const { return by_dtype[size_t(d)]; }
  // The group for this dtype key, or an Error naming the dtypes the op supports.
  const KernelGroup& group(const std::string& dtype_key) const;
  const KernelGroup* find_group(const std::string& dtype_key) const;
  std::vector<std::string> dtype_keys() const;
};

// Throws an Error listing close names when the op is unknown.
const OpInfo& op_info(const std::string& name);
const OpInfo* find_op(const std::string& name);
std::vector<const OpInfo*> all_ops();
// The kernel group with this id (KernelGroup::id), null if none.
const KernelGroup* kernel_group(uint32_t id);

// The CPU feature level the kernels were selected for ("avx512", "avx2" or "sse41").
std::string cpu_target();
// The device kind a kernel target runs on: "opencl", "cuda", else (x86 feature levels) the CPU.
DeviceKind target_device_kind(const char* target);

}  // namespace opforge
