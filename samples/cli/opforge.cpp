// The `opforge` command line: `info` lists the devices and every registered op with its dtypes
// and kernel variants (`--load`: each device's utilization, queue and measured load); `bench`
// compares opforge with peer libraries (tests/bench/peers.hpp), and `bench --scheduler` compares
// device placement policies (tests/bench/scheduler_bench.hpp). Text for people, --json for
// scripts. Runtime errors exit 1, bad arguments 2.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "opforge/device.hpp"
#include "opforge/dispatch.hpp"
#include "opforge/error.hpp"
#include "opforge/registry.hpp"
#include "opforge/torch/distributed.hpp"
#include "parallel_bench.hpp"
#include "peers.hpp"
#include "scheduler_bench.hpp"
#include "train.hpp"
#include "train_bench.hpp"

namespace opforge::cli {
namespace {

// Keys stay in the order written, so the output reads like the documented schema.
using Json = nlohmann::ordered_json;

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// Columns as wide as their widest cell; numeric columns align right so digits line up.
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<bool> right_aligned = {})
      : header_(std::move(header)), right_(std::move(right_aligned)) {
    right_.resize(header_.size(), false);
  }
  void add(std::vector<std::string> row) {
    row.resize(header_.size());
    rows_.push_back(std::move(row));
  }
  void print(std::ostream& os) const {
    std::vector<size_t> width(header_.size());
    for (size_t c = 0; c < header_.size(); ++c) {
      width[c] = header_[c].size();
      for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
    }
    print_row(os, header_, width);
    std::vector<std::string> rule;
    for (size_t w : width) rule.push_back(std::string(w, '-'));
    print_row(os, rule, width);
    for (const auto& row : rows_) print_row(os, row, width);
  }

 private:
  void print_row(std::ostream& os, const std::vector<std::string>& row,
                 const std::vector<size_t>& width) const {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      if (c) line += "  ";
      // The last left-aligned column is not padded, so lines carry no trailing blanks.
      line += right_[c] ? pad + row[c] : (c + 1 == row.size() ? row[c] : row[c] + pad);
    }
    os << line << '\n';
  }
  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// ---- info ----

// What `info` shows of each discovered device. CPU kernels run at the best feature level this
// CPU supports; other kinds have no kernels yet.
struct DeviceRow {
  std::string name, kind, model, target;
  unsigned cores;
  uint64_t memory;
};

std::vector<DeviceRow> device_rows() {
  std::vector<DeviceRow> rows;
  for (const DeviceInfo& d : opforge::devices()) {
    bool cpu = d.device.kind == DeviceKind::cpu;
    rows.push_back({d.device.str(), d.device.str().substr(0, d.device.str().find(':')), d.name,
                    cpu ? cpu_target() : "", unsigned(d.cores), d.total_memory});
  }
  return rows;
}

// "cpu" for the x86 feature levels, else the GPU API the kernel targets ("opencl", "cuda").
std::string device_kind_name(const std::string& target) {
  return target_device_kind(target.c_str()) == DeviceKind::cpu ? "cpu" : target;
}

struct VariantRow {
  std::string name, target;
  std::vector<int64_t> min_extents;  // in the op family's call extents; 0 = no minimum
  bool dense_entry = false;          // it has a dense companion for contiguous calls
};

// A variant usually exists for every dtype of its op; listing it once per op is what a reader
// wants, so the first group that has it speaks for all.
std::vector<VariantRow> op_variants(const OpInfo& op) {
  std::vector<VariantRow> rows;
  std::set<std::string> seen;
  for (const auto& [key, group] : op.groups) {
    for (const VariantInfo& v : group.variants) {
      // The same schedule is generated for several GPU APIs: a row per (name, target).
      if (!seen.insert(v.name + "@" + (v.kernel ? v.kernel->target : "")).second) continue;
      VariantRow row{v.name, "", {}};
      if (v.kernel) {
        row.target = v.kernel->target;
        row.dense_entry = v.kernel->dense_argv != nullptr;
        const int n = std::clamp(v.num_extents, 0, kMaxCallExtents);
        row.min_extents.assign(v.kernel->min_extents, v.kernel->min_extents + n);
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

// An op's buffers with their roles, from its first dtype group (the roles and ranks are the same
// in every group; the dtypes are the group's).
const std::vector<BufferSpec>& op_buffers(const OpInfo& op) {
  return op.groups.begin()->second.buffers;
}

// "a,b -> out"; a buffer written in place is marked "(inout)".
std::string buffers_text(const OpInfo& op) {
  std::vector<std::string> reads, writes;
  for (const BufferSpec& b : op_buffers(op)) {
    if (b.role == BufferRole::output)
      writes.push_back(b.name);
    else
      reads.push_back(std::string(b.name) + (b.role == BufferRole::inout ? "(inout)" : ""));
  }
  return join(reads, ",") + (writes.empty() ? "" : " -> " + join(writes, ","));
}

std::vector<const OpInfo*> sorted_ops() {
  std::vector<const OpInfo*> ops = all_ops();
  std::sort(ops.begin(), ops.end(),
            [](const OpInfo* a, const OpInfo* b) { return a->name < b->name; });
  return ops;
}

Json info_json() {
  Json devs = Json::array();
  for (const DeviceRow& d : device_rows()) {
    devs.push_back({{"name", d.name},
                    {"kind", d.kind},
                    {"model", d.model},
                    {"target", d.target},
                    {"cores", d.cores},
                    {"memory_bytes", d.memory}});
  }
  Json ops = Json::array();
  for (const OpInfo* op : sorted_ops()) {
    Json variants = Json::array();
    for (const VariantRow& v : op_variants(*op)) {
      variants.push_back({{"name", v.name},
                          {"device_kind", device_kind_name(v.target)},
                          {"target", v.target},
                          {"min_extents", v.min_extents},
                          {"dense_entry", v.dense_entry}});
    }
    Json buffers = Json::array();
    for (const BufferSpec& b : op_buffers(*op))
      buffers.push_back({{"name", b.name}, {"role", role_name(b.role)}, {"rank", b.dims}});
    Json attrs = Json::array();
    for (const AttrInfo& a : op->attrs)
      attrs.push_back({{"name", a.name}, {"type", a.integer ? "int32" : "float64"}});
    ops.push_back({{"name", op->name},
                   {"family", op->family},
                   {"dtypes", op->dtype_keys()},
                   {"buffers", std::move(buffers)},
                   {"attributes", std::move(attrs)},
                   {"variants", std::move(variants)}});
  }
  Json out = Json::object();
  out["devices"] = std::move(devs);
  out["ops"] = std::move(ops);
  return out;
}

void print_info_text(std::ostream& os) {
  const std::vector<DeviceRow> devs = device_rows();
  Table dev_table({"device", "kind", "model", "target", "cores", "memory"},
                  {false, false, false, false, true, true});
  for (const DeviceRow& d : devs)
    dev_table.add({d.name, d.kind, d.model, d.target, d.cores ? std::to_string(d.cores) : "",
                   std::to_string(d.memory >> 20) + " MiB"});
  dev_table.print(os);
  os << '\n';

  // A variant's target is shown only where it falls below the device's, which is the exception.
  const std::string device_target = devs.front().target;
  Table op_table({"op", "family", "buffers", "dtypes", "variants"});
  size_t kernels = 0;
  const std::vector<const OpInfo*> ops = sorted_ops();
  for (const OpInfo* op : ops) {
    std::vector<std::string> cells;
    for (const VariantRow& v : op_variants(*op)) {
      std::string cell = v.name + (v.dense_entry ? "+dense" : "");
      if (!v.target.empty() && v.target != device_target) cell += "@" + v.target;
      if (std::any_of(v.min_extents.begin(), v.min_extents.end(),
                      [](int64_t e) { return e > 0; })) {
        std::vector<std::string> mins;
        for (int64_t e : v.min_extents) mins.push_back(std::to_string(e));
        cell += " (min " + join(mins, "x") + ")";
      }
      cells.push_back(cell);
    }
    for (const auto& [key, group] : op->groups) kernels += group.variants.size();
    // cast has one kernel group per (from, to) pair: listing them all would widen every row.
    std::vector<std::string> keys = op->dtype_keys();
    std::string dtypes =
        keys.size() > 6 ? std::to_string(keys.size()) + " dtype pairs (--json)" : join(keys, ",");
    op_table.add({op->name, op->family, buffers_text(*op), dtypes, join(cells, ", ")});
  }
  op_table.print(os);
  os << '\n' << ops.size() << " ops, " << kernels << " kernels\n";
}

std::string fixed(double v, int digits = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// ---- info --load ----

// Utilization where the device reports one; "-" where it has none to give.
std::optional<double> utilization(const Device& d) {
  try {
    return dev_util(d);
  } catch (const Error&) {
    return std::nullopt;
  }
}

Json load_json() {
  Json devs = Json::array();
  std::map<std::string, DeviceStats> stats;
  for (const DeviceStats& s : device_stats()) stats[s.device.str()] = s;
  for (const DeviceInfo& d : devices()) {
    Json row = {{"name", d.device.str()}};
    auto u = utilization(d.device);
    row["utilization_percent"] = u ? Json(*u) : Json(nullptr);
    auto it = stats.find(d.device.str());
    row["runs_kernels"] = it != stats.end();
    if (it != stats.end()) {
      row["queue_length"] = it->second.queue_length;
      row["queued_ms"] = it->second.queued_seconds * 1e3;
      row["load_factor"] = it->second.load;
      row["kernel_calls"] = it->second.kernel_calls;
      // GPU memory: what tensors hold, and that plus the allocator's cache.
      if (d.device.kind != DeviceKind::cpu) {
        row["memory_allocated_mib"] = double(memory_allocated(d.device)) / (1 << 20);
        row["memory_reserved_mib"] = double(memory_reserved(d.device)) / (1 << 20);
        row["copied_to_device_mib"] = double(it->second.bytes_to_device) / (1 << 20);
        row["copied_from_device_mib"] = double(it->second.bytes_from_device) / (1 << 20);
      }
    }
    devs.push_back(std::move(row));
  }
  Json choices = Json::array();
  for (const DispatchStat& s : dispatch_stats())
    choices.push_back({{"op", s.op},
                       {"dtype", s.dtype},
                       {"variant", s.variant},
                       {"device", s.device.str()},
                       {"calls", s.calls},
                       {"mean_ms", s.mean_seconds * 1e3}});
  Json out = Json::object();
  out["devices"] = std::move(devs);
  out["choices"] = std::move(choices);
  return out;
}

void print_load_text(const Json& load, std::ostream& os) {
  Table devs({"device", "util %", "queue", "queued ms", "load", "kernel calls", "GPU MiB held",
              "GPU MiB reserved", "MiB copied in", "MiB copied out"},
             {false, true, true, true, true, true, true, true, true, true});
  for (const Json& d : load["devices"]) {
    auto num = [&](const char* key, int digits) {
      return d.contains(key) && !d[key].is_null() ? fixed(d[key].get<double>(), digits)
                                                  : std::string("-");
    };
    devs.add({d["name"].get<std::string>(), num("utilization_percent", 1), num("queue_length", 0),
              num("queued_ms", 2), num("load_factor", 2), num("kernel_calls", 0),
              num("memory_allocated_mib", 1), num("memory_reserved_mib", 1),
              num("copied_to_device_mib", 1), num("copied_from_device_mib", 1)});
  }
  devs.print(os);
  os << "\nload: measured slowdown from work that is not opforge's (1.00 = none); util: the last "
        "50 ms\n";
  if (load["choices"].empty()) return;
  os << '\n';
  Table choices({"op", "dtype", "variant", "device", "calls", "mean ms"},
                {false, false, false, false, true, true});
  for (const Json& c : load["choices"])
    choices.add({c["op"].get<std::string>(), c["dtype"].get<std::string>(),
                 c["variant"].get<std::string>(), c["device"].get<std::string>(),
                 std::to_string(c["calls"].get<int64_t>()), fixed(c["mean_ms"].get<double>(), 3)});
  choices.print(os);
}

int run_info(bool json, bool load) {
  if (load) {
    Json l = load_json();
    if (json)
      std::cout << l.dump(2) << '\n';
    else
      print_load_text(l, std::cout);
    return 0;
  }
  if (json) {
    std::cout << info_json().dump(2) << '\n';
  } else {
    print_info_text(std::cout);
  }
  return 0;
}

// ---- bench ----

int run_bench(bool json, const std::string& filter, int repeats) {
  BenchOptions options;
  options.filter = filter;
  options.repeats = repeats;
  // Progress only for a person watching: a full run takes a while, and pipes want clean output.
  if (isatty(STDERR_FILENO)) {
    options.on_start = [](const std::string& name) { std::cerr << "running " << name << "...\n"; };
  }
  const std::vector<BenchResult> results = run_benchmarks(options);

  if (json) {
    Json out = Json::array();
    for (const BenchResult& r : results) {
      out.push_back({{"name", r.name},
                     {"unit", r.unit},
                     {"ours", r.ours},
                     {"peer_name", r.peer_name},
                     {"peer", r.peer},
                     {"ratio", r.ratio},
                     {"variant", r.variant}});
    }
    std::cout << out.dump(2) << '\n';
    return 0;
  }
  Table table({"name", "unit", "ours", "peer_name", "peer", "ratio", "variant"},
              {false, false, true, false, true, true, false});
  for (const BenchResult& r : results) {
    const bool has_peer = r.peer > 0;
    table.add({r.name, r.unit, fixed(r.ours), r.peer_name, has_peer ? fixed(r.peer) : "-",
               has_peer ? fixed(r.ratio) + "x" : "-", r.variant});
  }
  table.print(std::cout);
  std::cout << "\nratio > 1: opforge is better (throughput: ours/peer; time per call: "
               "peer/ours). Each figure is the median of "
            << repeats << " repeats.\n";
  return 0;
}

// Two logical CPU devices of one core each: when the process was started without them, it starts
// itself again with OPFORGE_CPU_DEVICES="0;1" (devices are fixed at start-up).
void ensure_two_logical_cpus(const std::string& what, char** argv) {
  int cpus = 0;
  for (const DeviceStats& s : device_stats()) cpus += s.device.kind == DeviceKind::cpu;
  if (cpus >= 2) return;
  OPFORGE_CHECK(!std::getenv("OPFORGE_CPU_DEVICES"))
      << what << " needs two logical CPU devices, but OPFORGE_CPU_DEVICES='"
      << std::getenv("OPFORGE_CPU_DEVICES") << "' makes fewer";
  OPFORGE_CHECK(num_cpu_cores(true) >= 2)
      << what << " needs two cores, this machine has " << num_cpu_cores(true);
  setenv("OPFORGE_CPU_DEVICES", "0;1", 1);
  execv("/proc/self/exe", argv);
  throw Error(what + ": cannot restart with two logical devices: " + std::strerror(errno));
}

int run_scheduler_bench(bool json, int repeats, char** argv) {
  ensure_two_logical_cpus("bench --scheduler", argv);
  SchedulerBenchOptions o;
  o.repeats = repeats;
  if (isatty(STDERR_FILENO)) std::cerr << "running the scheduler benchmark...\n";
  SchedulerBenchResult r = run_scheduler_bench(o);
  if (json) {
    Json policies = Json::array();
    for (const PolicyResult& p : r.policies)
      policies.push_back({{"policy", p.policy},
                          {"items_per_second", p.items_per_second},
                          {"device_share", p.share}});
    Json out = {{"items", o.items},
                {"window", o.window},
                {"loaded_device", "cpu:" + std::to_string(o.loaded_device)},
                {"policies", std::move(policies)},
                {"best_fixed", r.best_fixed},
                {"auto_vs_round_robin", r.vs_round_robin},
                {"auto_vs_best_fixed", r.vs_best_fixed}};
    std::cout << out.dump(2) << '\n';
    return 0;
  }
  std::cout << "stream of " << o.items << " ops (matmul 128-320, elementwise chains 64K-256K), "
            << o.window << " in flight, cpu:" << o.loaded_device
            << "'s core kept busy by another process\n\n";
  Table t({"policy", "items/s", "calls on cpu:0", "calls on cpu:1"}, {false, true, true, true});
  for (const PolicyResult& p : r.policies)
    t.add({p.policy, fixed(p.items_per_second, 0), fixed(100 * p.share[0], 0) + "%",
           fixed(100 * p.share[1], 0) + "%"});
  t.print(std::cout);
  std::cout << "\nauto / round_robin: " << fixed(r.vs_round_robin) << "x (target >= 1.4x)\n"
            << "auto / best fixed (" << r.best_fixed << "): " << fixed(r.vs_best_fixed)
            << "x (target >= 0.9x)\nmedians of " << o.repeats << " passes per policy\n";
  return 0;
}

// `opforge bench --distributed`: the load-driven batch split against the static one, for each
// model (or the one named), then MPI's scaling on the MLP.
int run_parallel_bench(bool json, int repeats, int64_t batch_size, const std::string& model,
                       char** argv) {
  ensure_two_logical_cpus("bench --distributed", argv);
  std::vector<ParallelBenchOptions> runs;
  for (const char* name : {"mlp", "cnn"})
    if (model.empty() || model == name) {
      runs.emplace_back();
      runs.back().repeats = repeats;
      runs.back().batch_size = batch_size;
      runs.back().model = name;
    }
  std::vector<ParallelBenchResult> results;
  for (const ParallelBenchOptions& o : runs) {
    if (isatty(STDERR_FILENO))
      std::cerr << "running the data-parallel benchmark (" << o.model << ")...\n";
    results.push_back(run_parallel_bench(o));
  }
  const MpiScaling m = run_mpi_scaling(std::filesystem::read_symlink("/proc/self/exe").string(),
                                       repeats, batch_size);
  auto run = [](const SplitRun& s) {
    Json split = Json::object();
    for (const auto& [dev, share] : s.split) split[dev] = share;
    return Json{{"samples_per_second", s.samples_per_second},
                {"split", split},
                {"share_ms", s.share_ms},
                {"ms_per_step",
                 {{"passes", s.passes_ms}, {"optimizer", s.optimizer_ms}, {"data", s.data_ms}}}};
  };
  if (json) {
    Json parallel = Json::array();
    for (size_t i = 0; i < runs.size(); i++)
      parallel.push_back({{"model", runs[i].model},
                          {"batch_size", runs[i].batch_size},
                          {"loaded_device", "cpu:" + std::to_string(runs[i].loaded_device)},
                          {"measured_split", run(results[i].measured)},
                          {"fixed_split", run(results[i].fixed)},
                          {"ratio", results[i].ratio}});
    std::cout << Json{{"data_parallel", parallel},
                      {"mpi_scaling", m.ran
                                          ? Json{{"model", "mlp"},
                                                 {"batch_size", batch_size},
                                                 {"one_process_one_core", m.one_process},
                                                 {"two_ranks_one_core_each", m.two_ranks},
                                                 {"efficiency", m.efficiency},
                                                 {"without_communication", m.without_communication},
                                                 {"efficiency_without_communication",
                                                  m.efficiency_without_communication},
                                                 {"reduce_wait_ms", m.reduce_ms},
                                                 {"allreduce_ms", m.allreduce_ms},
                                                 {"step_ms", m.step_ms}}
                                          : Json{{"missing", m.why_not}}}}
                     .dump(2)
              << '\n';
    return 0;
  }
  for (size_t i = 0; i < runs.size(); i++) {
    const ParallelBenchOptions& o = runs[i];
    const ParallelBenchResult& r = results[i];
    std::cout << (i ? "\n" : "") << "train_" << o.model
              << " data-parallel on cpu:0 and cpu:1 (one core each), batch " << o.batch_size
              << ", cpu:" << o.loaded_device << "'s core kept busy by another process\n\n";
    Table t({"split", "samples/s", "share of cpu:0", "share of cpu:1", "passes ms", "cpu:0 ms",
             "cpu:1 ms", "optimizer ms", "data ms"},
            {false, true, true, true, true, true, true, true, true});
    auto add = [&](const std::string& name, const SplitRun& s) {
      t.add({name, fixed(s.samples_per_second, 0),
             s.split.size() > 0 ? fixed(100 * s.split[0].second, 1) + "%" : "-",
             s.split.size() > 1 ? fixed(100 * s.split[1].second, 1) + "%" : "-", fixed(s.passes_ms),
             s.share_ms.size() > 0 ? fixed(s.share_ms[0]) : "-",
             s.share_ms.size() > 1 ? fixed(s.share_ms[1]) : "-", fixed(s.optimizer_ms),
             fixed(s.data_ms, 3)});
    };
    add("measured throughput", r.measured);
    add("fixed (by cores)", r.fixed);
    t.print(std::cout);
    std::cout << "\nmeasured / fixed: " << fixed(r.ratio)
              << "x (target >= 1.3x, limit 1.5x)\nmedians of " << o.repeats
              << " alternated rounds of " << o.steps << " steps after " << o.warmup << "\n";
  }
  if (!m.ran) {
    std::cout << "\nMPI scaling: not measured (" << m.why_not << ")\n";
    return 0;
  }
  std::cout << "\ntrain_mlp, batch " << batch_size
            << " in all: one process on one core against two MPI ranks of one core each\n\n";
  Table s({"run", "samples/s", "efficiency"}, {false, true, true});
  s.add({"1 process, 1 core", fixed(m.one_process, 0), "-"});
  s.add(
      {"2 ranks (mpirun), 1 core each", fixed(m.two_ranks, 0), fixed(100 * m.efficiency, 1) + "%"});
  s.add({"2 processes of half the batch, no communication", fixed(m.without_communication, 0),
         fixed(100 * m.efficiency_without_communication, 1) + "%"});
  s.print(std::cout);
  std::cout << "\nscaling efficiency: " << fixed(100 * m.efficiency, 1)
            << "% (target >= 85%); one all-reduce of the gradients between the ranks "
            << fixed(m.allreduce_ms, 3)
            << " ms, a rank's wait for the sums after its backward pass " << fixed(m.reduce_ms, 3)
            << " ms, a step on one core " << fixed(m.step_ms, 2) << " ms; medians of " << repeats
            << " alternated rounds\n(the last row: twice the slower process's samples/s, what two "
               "ranks could reach if communicating cost nothing)\n";
  return 0;
}

int run_train_bench(bool json, const std::string& filter, int repeats, const std::string& python,
                    int64_t batch_size) {
  TrainBenchOptions o;
  o.repeats = repeats;
  o.python = python;
  o.batch_size = batch_size;
  if (const char* t = std::getenv("HL_NUM_THREADS")) o.threads = std::atoi(t);
  std::regex re(filter.empty() ? "." : filter);
  o.models.erase(
      std::remove_if(o.models.begin(), o.models.end(),
                     [&](const std::string& m) { return !std::regex_search("train_" + m, re); }),
      o.models.end());
  if (isatty(STDERR_FILENO)) std::cerr << "running the training benchmark...\n";
  TrainBenchResult r = run_train_bench(o);
  auto phases = [](const TrainPhases& p) {
    return Json{{"samples_per_second", p.samples_per_second},
                {"ms_per_step",
                 {{"data", p.data_ms},
                  {"forward", p.forward_ms},
                  {"backward", p.backward_ms},
                  {"optimizer", p.optimizer_ms}}}};
  };
  if (json) {
    Json rows = Json::array();
    for (const TrainBenchRow& row : r.rows)
      rows.push_back({{"name", "train_" + row.model},
                      {"steps", row.steps},
                      {"ours", phases(row.ours)},
                      {"peer_name", row.peer_name},
                      {"peer", phases(row.peer)},
                      {"ratio", row.ratio}});
    std::cout << Json{{"threads", r.threads}, {"batch_size", r.batch_size}, {"rows", rows}}.dump(2)
              << '\n';
    return 0;
  }
  Table t(
      {"name", "who", "samples/s", "data ms", "forward ms", "backward ms", "optimizer ms", "ratio"},
      {false, false, true, true, true, true, true, true});
  for (const TrainBenchRow& row : r.rows) {
    auto add = [&](const std::string& who, const TrainPhases& p, const std::string& ratio) {
      t.add({"train_" + row.model, who, fixed(p.samples_per_second, 0), fixed(p.data_ms, 3),
             fixed(p.forward_ms), fixed(p.backward_ms), fixed(p.optimizer_ms), ratio});
    };
    add("opforge", row.ours, row.ratio > 0 ? fixed(row.ratio) + "x" : "-");
    if (row.ratio > 0) add(row.peer_name, row.peer, "");
  }
  t.print(std::cout);
  for (const TrainBenchRow& row : r.rows)
    if (row.ratio == 0) std::cout << "train_" << row.model << ": " << row.peer_name << "\n";
  std::cout << "\nSGD (momentum 0.9), batch " << r.batch_size << ", " << r.threads
            << " threads each; ms per step by phase; medians of " << repeats
            << " alternated rounds. ratio > 1: opforge trains faster.\n";
  return 0;
}

// Rejects a malformed --filter while parsing, so it exits as a bad argument rather than a
// runtime error.
const CLI::Validator kRegex(
    [](std::string& s) {
      try {
        std::regex re(s);
      } catch (const std::regex_error& e) {
        return std::string("not a valid regular expression: ") + e.what();
      }
      return std::string();
    },
    "REGEX", "regex");

// CLI11's PositiveNumber reports a bad value as outside "0.000000 to 1.79769e+308" (the double
// range, printed in full): this one says what was expected.
const CLI::Validator kPositive(
    [](std::string& s) {
      size_t used = 0;
      double v = 0;
      try {
        v = std::stod(s, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != s.size() || !std::isfinite(v) || v <= 0)
        return "expected a positive number, got " + s;
      return std::string();
    },
    "POSITIVE", "positive");

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{
      "opforge: train on Fashion-MNIST, inspect the operator library, benchmark it against peer "
      "libraries"};
  app.require_subcommand(1);

  bool info_json_flag = false;
  CLI::App* info =
      app.add_subcommand("info", "List devices and every op with its dtypes and variants");
  info->add_flag("--json", info_json_flag, "Print JSON instead of tables");
  bool info_load_flag = false;
  info->add_flag("--load", info_load_flag,
                 "Show each device's utilization, queue and measured load, and the dispatcher's "
                 "choices so far");

  bool bench_json_flag = false;
  std::string filter;
  int repeats = BenchOptions{}.repeats;
  CLI::App* bench = app.add_subcommand("bench", "Benchmark opforge against peer libraries");
  bench->add_flag("--json", bench_json_flag, "Print JSON instead of a table");
  bench->add_option("--filter", filter, "Run only benchmarks whose name matches this regex")
      ->check(kRegex);
  bench->add_option("--repeats", repeats, "Timed repeats per benchmark; the median is reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  bool scheduler_flag = false, train_flag = false, distributed_flag = false,
       mpi_worker_flag = false;
  std::string peer_python;
  int64_t bench_batch = 128;
  std::string bench_model;
  bench->add_flag("--scheduler", scheduler_flag,
                  "Compare device placement policies on two logical CPU devices, one of them "
                  "loaded by another process");
  bench->add_flag("--train", train_flag,
                  "Training samples/s of opforge train's models against PyTorch's, with where "
                  "each step's time goes (PyTorch from .venv: scripts/bench-venv.sh)");
  bench->add_flag("--distributed", distributed_flag,
                  "Data-parallel training on two logical CPU devices, one core loaded by another "
                  "process: the batch split by measured throughput against the fixed split");
  bench
      ->add_flag("--mpi-worker", mpi_worker_flag,
                 "Used by --distributed: time training steps as one rank of mpirun's (or alone)")
      ->group("");
  bench->add_option(
      "--python", peer_python,
      "Python of the PyTorch peer (default: .venv/bin/python, else /usr/bin/python3)");
  bench
      ->add_option("--model", bench_model,
                   "Model of --distributed's data-parallel part, mlp or cnn (default: both; its "
                   "MPI part trains mlp)")
      ->check(CLI::IsMember({"mlp", "cnn"}));
  bench->add_option("--batch-size", bench_batch, "Batch size of --train")
      ->check(kPositive)
      ->capture_default_str();

  TrainOptions train;
  CLI::App* train_cmd = app.add_subcommand(
      "train", "Train a model on Fashion-MNIST and write a run folder (weights, metrics, plot)");
  train_cmd->add_option("--model", train.model, "mlp (784-512-256-10, ReLU) or cnn")
      ->check(CLI::IsMember({"mlp", "cnn"}))
      ->capture_default_str();
  train_cmd->add_option("--epochs", train.epochs)->check(kPositive)->capture_default_str();
  std::string train_batch = "64";
  train_cmd
      ->add_option("--batch-size", train_batch,
                   "Samples per step, or auto: starting at 64, the batch grows while a larger one "
                   "raises the measured samples/s and memory has room, shrinks when memory runs "
                   "short or a device comes under load, within --batch-min..--batch-max; the "
                   "learning rate is scaled with it (off by default: it changes the result)")
      ->check(
          [](const std::string& s) -> std::string {
            if (s == "auto") return "";
            char* end = nullptr;
            errno = 0;
            const long long n = std::strtoll(s.c_str(), &end, 10);
            return !s.empty() && end && *end == 0 && errno == 0 && n > 0
                       ? ""
                       : "expected a positive number or auto, got " + s;
          },
          "N|auto")
      ->capture_default_str();
  train_cmd->add_option("--batch-min", train.batch_min, "Smallest batch of --batch-size auto")
      ->check(kPositive)
      ->capture_default_str();
  train_cmd->add_option("--batch-max", train.batch_max, "Largest batch of --batch-size auto")
      ->check(kPositive)
      ->capture_default_str();
  train_cmd->add_option("--optimizer", train.optimizer, "sgd (momentum 0.9), adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  train_cmd->add_option("--lr", train.lr, "Learning rate (default: 0.05 for sgd, 1e-3 for adam)")
      ->check(kPositive);
  train_cmd
      ->add_option("--lr-schedule", train.lr_schedule,
                   "none, cosine (annealed to 0 over the epochs) or step (a tenth every third of "
                   "the epochs), stepped per epoch")
      ->check(CLI::IsMember({"none", "cosine", "step"}))
      ->capture_default_str();
  train_cmd->add_option("--label-smoothing", train.label_smoothing)->check(CLI::Range(0.0, 1.0));
  train_cmd->add_option("--seed", train.seed, "Seeds the initialisation and the data order")
      ->capture_default_str();
  train_cmd->add_option("--threads", train.threads, "Kernel threads (default: every core)")
      ->check(kPositive);
  train_cmd
      ->add_option("--device", train.device,
                   "auto (placed per call) or one device: cpu, "
                   "opencl:0, cuda:0")
      ->capture_default_str();
  train_cmd->add_option(
      "--devices", train.devices,
      "Data-parallel: each step's batch split over these devices in proportion to their "
      "measured speed, e.g. cpu:0,cpu:1,opencl:0, or auto (every device automatic placement "
      "uses); cpu:N split the cores evenly unless OPFORGE_CPU_DEVICES is set");
  train_cmd->add_flag("--distributed", train.distributed,
                      "Train as one rank of mpirun's (mpirun -np N opforge train --distributed): "
                      "each rank on its part of every batch, gradients averaged with MPI");
  train_cmd->add_option("--data", train.data, "Folder with the Fashion-MNIST IDX files");
  train_cmd->add_option("--limit", train.limit, "Train on the first N training images only")
      ->check(kPositive);
  train_cmd->add_option("--out", train.out, "Run folder (default: runs/<model>-<date>-<time>)");
  train_cmd
      ->add_option("--checkpoint-every", train.checkpoint_every,
                   "Write the run folder's checkpoint every N steps too (it is written at every "
                   "epoch's end)")
      ->check(kPositive);
  train_cmd
      ->add_option("--resume", train.resume,
                   "Go on with the run in this folder from its checkpoint (with the options it "
                   "was started with)")
      ->check(CLI::ExistingDirectory);
  train_cmd
      ->add_option("--max-steps", train.max_steps,
                   "Stop after N steps, leaving a checkpoint to --resume from")
      ->check(kPositive);

  EvalOptions eval;
  CLI::App* eval_cmd = app.add_subcommand(
      "eval", "Test accuracy and confusion matrix of weights from opforge train");
  eval_cmd->add_option("--weights", eval.weights, "weights.safetensors of a run")
      ->required()
      ->check(CLI::ExistingFile);
  eval_cmd->add_option("--data", eval.data, "Folder with the Fashion-MNIST IDX files");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help); its own exit codes (100+) would read as crashes.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  try {
    if (*info) return run_info(info_json_flag, info_load_flag);
    if (*train_cmd) {
      // Halide's thread pool reads it when the first kernel runs.
      if (train.threads > 0) setenv("HL_NUM_THREADS", std::to_string(train.threads).c_str(), 1);
      // Logical CPU devices are made when the runtime starts, from OPFORGE_CPU_DEVICES.
      if (std::string spec = split_cores_for(train.devices); !spec.empty())
        std::cout << "opforge train: OPFORGE_CPU_DEVICES=\"" << spec << "\"\n";
      if (train_batch == "auto") {
        OPFORGE_CHECK(train.batch_min <= train.batch_max)
            << "--batch-min " << train.batch_min << " is above --batch-max " << train.batch_max;
        train.batch_auto = true;
        train.batch_size = std::clamp<int64_t>(64, train.batch_min, train.batch_max);
      } else {
        train.batch_size = std::strtoll(train_batch.c_str(), nullptr, 10);  // checked by CLI11
      }
      return run_train(train);
    }
    if (*eval_cmd) return run_eval(eval);
    if (*bench && scheduler_flag)
      return run_scheduler_bench(
          bench_json_flag, bench->count("--repeats") ? repeats : SchedulerBenchOptions{}.repeats,
          argv);
    if (*bench && mpi_worker_flag) return run_mpi_worker(bench_batch);
    if (*bench && distributed_flag)
      return run_parallel_bench(
          bench_json_flag, bench->count("--repeats") ? repeats : ParallelBenchOptions{}.repeats,
          bench_batch, bench_model, argv);
    if (*bench && train_flag)
      return run_train_bench(bench_json_flag, filter,
                             bench->count("--repeats") ? repeats : TrainBenchOptions{}.repeats,
                             peer_python, bench_batch);
    if (*bench) return run_bench(bench_json_flag, filter, repeats);
  } catch (const std::exception& e) {  // opforge::Error and whatever the peers throw
    std::cout.flush();
    std::cerr << "opforge: error: " << e.what() << '\n';
    torch::distributed::abort_job(1);  // the other ranks, if any, must not wait for this one
    return 1;
  }
  return 0;
}

}  // namespace opforge::cli

int main(int argc, char** argv) { return opforge::cli::run(argc, argv); }
