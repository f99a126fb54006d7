// The process-wide kernel registry. Generated registry sources add their kernels; for each
// (op, dtype, variant) the best CPU feature level this machine supports is kept.
#include "opforge/registry.hpp"

#include <HalideRuntime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>

#include "opforge/error.hpp"
#include "opforge/scheduler.hpp"

namespace opforge {
namespace detail {
void register_builtin_kernels();
}

namespace {

int target_rank(const char* target) {
  if (std::strcmp(target, "avx512") == 0) return 3;
  if (std::strcmp(target, "avx2") == 0) return 2;
  if (std::strcmp(target, "sse41") == 0) return 1;
  return 0;
}

int cpu_rank() {
  static const int rank = [] {
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                  __builtin_cpu_supports("avx512cd");
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                __builtin_cpu_supports("f16c");
    int r = avx512 && avx2 ? 3 : avx2 ? 2 : __builtin_cpu_supports("sse4.1") ? 1 : 0;
    if (const char* cap = std::getenv("OPFORGE_CPU_TARGET")) r = std::min(r, target_rank(cap));
    return r;
  }();
  return rank;
}

// What readers see: every op by name and every kernel group by id, published whole. A
// registration copies the ops it changes, builds a new snapshot and publishes it with one atomic
// store, so a reader never takes a lock and never sees half a registration. Every version of an
// op and every snapshot stays alive for the process's lifetime: a reader (or a function-local
// `static const OpInfo&`) may hold any of them.
struct Snapshot {
  std::map<std::string, const OpInfo*> ops;
  std::vector<const KernelGroup*> groups;  // by KernelGroup::id
};

struct Registry {
  std::mutex mu;  // serialises registrations
  std::deque<std::unique_ptr<OpInfo>> ops;
  std::deque<std::unique_ptr<Snapshot>> snapshots;
  std::atomic<const Snapshot*> current{nullptr};
  uint32_t next_group = 0;
};

Registry& registry_storage() {
  static auto* r = new Registry;  // never destroyed: queued calls may still run at exit
  return *r;
}

// How many call extents the family's canonical view has (see the generators' pipelines).
int call_extent_count(const OpInfo& op) {
  if (op.family == "reduction") return 3;
  if (op.family == "contraction" || op.family == "window") return 4;
  if (op.family == "movement" && op.name == "gather") return 3;
  return kMaxCallExtents;
}

// Built-in kernels are registered on first use rather than by static initialisers, which a
// static library's linker would drop.
Registry& registry() {
  static std::once_flag once;
  std::call_once(once, [] { detail::register_builtin_kernels(); });
  return registry_storage();
}

const Snapshot& snapshot() {
  static const Snapshot empty;
  const Snapshot* s = registry().current.load(std::memory_order_acquire);
  return s ? *s : empty;
}

}  // namespace

void register_kernels(const KernelVariant* variants, size_t count) {
  Registry& r = registry_storage();
  std::lock_guard<std::mutex> lock(r.mu);
  const Snapshot* old = r.current.load(std::memory_order_relaxed);
  auto snap = std::make_unique<Snapshot>(old ? *old : Snapshot{});
  std::map<std::string, OpInfo*> changed;  // fresh copies of the ops this registration touches
  auto writable = [&](const char* name) -> OpInfo& {
    if (auto it = changed.find(name); it != changed.end()) return *it->second;
    auto copy = std::make_unique<OpInfo>();
    if (auto it = snap->ops.find(name); it != snap->ops.end()) *copy = *it->second;
    OpInfo* op = copy.get();
    r.ops.push_back(std::move(copy));
    changed[name] = op;
    snap->ops[name] = op;
    return *op;
  };
  for (size_t i = 0; i < count; i++) {
    const KernelVariant& k = variants[i];
    DeviceKind kind = target_device_kind(k.target);
    int rank = target_rank(k.target);
    if (kind == DeviceKind::cpu && (rank == 0 || rank > cpu_rank())) continue;
    OpInfo& op = writable(k.op);
    OPFORGE_CHECK(k.buffers && k.num_buffers > 0 && k.num_buffers <= kMaxKernelBuffers)
        << k.op << " (" << k.dtype_key << ", variant " << k.variant << "): " << k.num_buffers
        << " buffers; a kernel has 1 to " << kMaxKernelBuffers;
    if (op.name.empty()) {
      op.name = k.op;
      op.family = k.family;
      op.flags = k.flags;
      op.attrs = parse_attr_spec(k.attrs);
      for (int b = 0; b < k.num_buffers; b++) {
        BufferRole role = k.buffers[b].role;
        if (role == BufferRole::inout) op.inout_mask |= 1u << op.num_inputs;
        if (reads(role))
          op.num_inputs++;
        else
          op.num_outputs++;
      }
    }
    KernelGroup& g = op.groups[k.dtype_key];
    if (!g.op) {
      g.op = &op;
      g.dtype_key = k.dtype_key;
      g.in_dtype = k.in_dtype;
      g.out_dtype = k.out_dtype;
      // The dispatcher's bucket key holds the group in 16 bits.
      OPFORGE_CHECK(r.next_group < 0xFFFF) << "more than 65535 kernel groups";
      g.id = r.next_group++;
      g.buffers.assign(k.buffers, k.buffers + k.num_buffers);
    }
    // Every variant of a group shares the group's buffer contract; one that differs is a build
    // fault, refused here rather than called with the wrong arguments.
    bool same = int(g.buffers.size()) == k.num_buffers;
    for (int b = 0; same && b < k.num_buffers; b++)
      same = g.buffers[size_t(b)].role == k.buffers[b].role &&
             g.buffers[size_t(b)].dtype == k.buffers[b].dtype &&
             g.buffers[size_t(b)].dims == k.buffers[b].dims;
    OPFORGE_CHECK(same) << k.op << " (" << k.dtype_key << "): variant " << k.variant
                        << " declares other buffers than the group's first variant";
    auto it = std::find_if(g.variants.begin(), g.variants.end(), [&](const VariantInfo& v) {
      return v.name == k.variant && v.kind == kind;
    });
    if (it == g.variants.end()) {
      VariantInfo v;
      v.name = k.variant;
      v.kernel = &k;
      v.kind = kind;
      v.num_extents = call_extent_count(op);
      g.kind_variants[int(kind)].insert(g.variants.size());
      g.variants.push_back(v);
    } else if (target_rank(it->kernel->target) < rank) {
      it->kernel = &k;
    }
  }
  // The copies' groups point back at the copy, and its by-dtype index at its own groups.
  for (auto& [name, op] : changed) {
    for (auto& b : op->by_dtype) b = nullptr;
    for (auto& [key, g] : op->groups) {
      g.op = op;
      g.any_extents = VariantSet();
      g.has_dense = false;
      for (const VariantInfo& v : g.variants) g.has_dense = g.has_dense || v.kernel->dense_argv;
      for (size_t i = 0; i < g.variants.size(); i++)
        if (std::all_of(std::begin(g.variants[i].kernel->min_extents),
                        std::end(g.variants[i].kernel->min_extents),
                        [](int64_t e) { return e <= 1; }))
          g.any_extents.insert(i);
      for (DType d : kAllDTypes)
        if (key == dtype_name(d)) op->by_dtype[size_t(d)] = &g;
    }
  }
  snap->groups.assign(r.next_group, nullptr);
  for (const auto& [name, op] : snap->ops)
    for (const auto& [key, g] : op->groups) snap->groups[g.id] = &g;
  r.snapshots.push_back(std::move(snap));
  r.current.store(r.snapshots.back().get(), std::memory_order_release);
}

bool VariantInfo::has_minimum() const {
  for (auto e : kernel->min_extents)
    if (e > 1) return true;
  return false;
}

const KernelGroup* OpInfo::find_group(const std::string& key) const {
  auto it = groups.find(key);
  return it == groups.end() ? nullptr : &it->second;
}

const KernelGroup& OpInfo::group(const std::string& key) const {
  if (const KernelGroup* g = find_group(key)) return *g;
  std::ostringstream os;
  for (const auto& k : dtype_keys()) os << (os.tellp() ? ", " : "") << k;
  OPFORGE_CHECK(false) << name << ": unsupported dtype " << key << "; supported: " << os.str();
  __builtin_unreachable();
}

std::vector<std::string> OpInfo::dtype_keys() const {
  std::vector<std::string> k;
  for (const auto& [key, g] : groups) k.push_back(key);
  return k;
}

const OpInfo* find_op(const std::string& name) {
  const Snapshot& s = snapshot();
  auto it = s.ops.find(name);
  return it == s.ops.end() ? nullptr : it->second;
}

const OpInfo& op_info(const std::string& name) {
  if (const OpInfo* op = find_op(name)) return *op;
  std::ostringstream known;
  for (const auto& [n, op] : snapshot().ops) known << (known.tellp() ? ", " : "") << n;
  OPFORGE_CHECK(false) << "unknown op '" << name << "'; registered ops: " << known.str();
  __builtin_unreachable();
}

const KernelGroup* kernel_group(uint32_t id) {
  const Snapshot& s = snapshot();
  return id < s.groups.size() ? s.groups[id] : nullptr;
}

std::vector<const OpInfo*> all_ops() {
  std::vector<const OpInfo*> v;
  for (const auto& [n, op] : snapshot().ops) v.push_back(op);
  return v;
}

DeviceKind target_device_kind(const char* target) {
  if (std::strcmp(target, "opencl") == 0) return DeviceKind::opencl;
  if (std::strcmp(target, "cuda") == 0) return DeviceKind::cuda;
  return DeviceKind::cpu;
}

std::string cpu_target() {
  switch (cpu_rank()) {
    case 3:
      return "avx512";
    case 2:
      return "avx2";
    case 1:
      return "sse41";
  }
  return "none";
}

}  // namespace opforge
