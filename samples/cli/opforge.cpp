// The `opforge` command line: `info` lists the devices and every registered op with its dtypes
// and kernel variants; `bench` compares opforge with peer libraries (tests/bench/peers.hpp). Text
// for people, --json for scripts. Runtime errors exit 1, bad arguments 2.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "opforge/device.hpp"
#include "opforge/registry.hpp"
#include "peers.hpp"

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

struct VariantRow {
  std::string name, target;
  std::vector<int64_t> min_extents;  // in the op family's call extents; 0 = no minimum
};

// A variant usually exists for every dtype of its op; listing it once per op is what a reader
// wants, so the first group that has it speaks for all.
std::vector<VariantRow> op_variants(const OpInfo& op) {
  std::vector<VariantRow> rows;
  std::set<std::string> seen;
  for (const auto& [key, group] : op.groups) {
    for (const VariantInfo& v : group.variants) {
      if (!seen.insert(v.name).second) continue;
      VariantRow row{v.name, "", {}};
      if (v.kernel) {
        row.target = v.kernel->target;
        const int n = std::clamp(v.num_extents, 0, kMaxCallExtents);
        row.min_extents.assign(v.kernel->min_extents, v.kernel->min_extents + n);
      }
      rows.push_back(std::move(row));
    }
  }
  return rows;
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
                          {"device_kind", "cpu"},
                          {"target", v.target},
                          {"min_extents", v.min_extents}});
    }
    ops.push_back({{"name", op->name},
                   {"family", op->family},
                   {"dtypes", op->dtype_keys()},
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
  Table op_table({"op", "family", "dtypes", "variants"});
  size_t kernels = 0;
  const std::vector<const OpInfo*> ops = sorted_ops();
  for (const OpInfo* op : ops) {
    std::vector<std::string> cells;
    for (const VariantRow& v : op_variants(*op)) {
      std::string cell = v.name;
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
    op_table.add({op->name, op->family, join(op->dtype_keys(), ","), join(cells, ", ")});
  }
  op_table.print(os);
  os << '\n' << ops.size() << " ops, " << kernels << " kernels\n";
}

int run_info(bool json) {
  if (json) {
    std::cout << info_json().dump(2) << '\n';
  } else {
    print_info_text(std::cout);
  }
  return 0;
}

// ---- bench ----

std::string fixed(double v, int digits = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

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

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"opforge: inspect the operator library and benchmark it against peer libraries"};
  app.require_subcommand(1);

  bool info_json_flag = false;
  CLI::App* info =
      app.add_subcommand("info", "List devices and every op with its dtypes and variants");
  info->add_flag("--json", info_json_flag, "Print JSON instead of tables");

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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help); its own exit codes (100+) would read as crashes.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  try {
    if (*info) return run_info(info_json_flag);
    if (*bench) return run_bench(bench_json_flag, filter, repeats);
  } catch (const std::exception& e) {  // opforge::Error and whatever the peers throw
    std::cout.flush();
    std::cerr << "opforge: error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}

}  // namespace opforge::cli

int main(int argc, char** argv) { return opforge::cli::run(argc, argv); }
