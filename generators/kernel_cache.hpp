// The kernel compiler's content-addressed cache: one object file per kernel (op x dtype x variant x
// target), found by a key that hashes what the kernel is made of. The key is taken before any
// scheduling: the op's Halide definition (every Func it calls, with names made canonical, because
// Halide numbers its generated names per process and adding an op would renumber every later one),
// its arguments, the variant and target, and the sources that schedule and compile it (hand
// schedules, pipelines, this compiler). Editing one op changes only its own kernels' keys.
#pragma once
#include <Halide.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "generators/pipeline.hpp"

namespace opforge::gen {
namespace fs = std::filesystem;
namespace hir = Halide::Internal;

// 128 bits as two FNV-1a 64 hashes with different offset bases: far more than the few thousand
// kernels of a build need, and stable across compilers and runs (std::hash is neither).
inline std::string content_hash(std::string_view text) {
  uint64_t a = 14695981039346656037ull, b = 0x6c62272e07bb0142ull;
  for (unsigned char c : text) {
    a = (a ^ c) * 1099511628211ull;
    b = (b ^ c) * 1099511628211ull;
    b ^= b >> 29;
  }
  char out[33];
  snprintf(out, sizeof out, "%016llx%016llx", static_cast<unsigned long long>(a),
           static_cast<unsigned long long>(b));
  return out;
}

namespace detail {
// Renames Funcs, pure and reduction variables and lets to their order of first appearance; keeps
// the names of the kernel's parameters, which are its ABI.
class Canonical : public hir::IRMutator {
 public:
  const std::string& name(const std::string& original, char kind) {
    auto [it, fresh] = names_.try_emplace(original);
    if (fresh) it->second = kind + std::to_string(names_.size());
    return it->second;
  }
  using hir::IRMutator::mutate;

 protected:
  using hir::IRMutator::visit;
  Halide::Expr visit(const hir::Variable* op) override {
    auto it = names_.find(op->name);
    if (op->param.defined() || it == names_.end()) return op;
    return hir::Variable::make(op->type, it->second);
  }
  Halide::Expr visit(const hir::Let* op) override {
    Halide::Expr value = mutate(op->value);
    std::string n = name(op->name, 't');
    return hir::Let::make(n, value, mutate(op->body));
  }
  Halide::Expr visit(const hir::Call* op) override {
    std::vector<Halide::Expr> args;
    for (const auto& a : op->args) args.push_back(mutate(a));
    std::string n = op->call_type == hir::Call::Halide ? name(op->name, 'f') : op->name;
    return hir::Call::make(op->type, n, args, op->call_type, op->func, op->value_index, op->image,
                           op->param);
  }

 private:
  std::map<std::string, std::string> names_;
};

// The Funcs a definition calls, in the order they appear.
class CallOrder : public hir::IRVisitor {
 public:
  std::vector<hir::Function> calls;

 protected:
  using hir::IRVisitor::visit;
  void visit(const hir::Call* op) override {
    hir::IRVisitor::visit(op);
    if (op->call_type == hir::Call::Halide && op->func.defined())
      calls.push_back(hir::Function(op->func));
  }
};

inline std::vector<hir::Definition> definitions(const hir::Function& f) {
  std::vector<hir::Definition> d;
  if (f.has_pure_definition()) d.push_back(f.definition());
  for (const auto& u : f.updates()) d.push_back(u);
  return d;
}

inline void visit_definition(const hir::Definition& d, hir::IRVisitor& v) {
  for (const auto& e : d.args()) e.accept(&v);
  for (const auto& e : d.values()) e.accept(&v);
  if (d.predicate().defined()) d.predicate().accept(&v);
  for (const auto& rv : d.schedule().rvars()) {
    rv.min.accept(&v);
    rv.extent.accept(&v);
  }
}
}  // namespace detail

// The text the key hashes for one (op, dtype) pipeline, before any schedule is applied.
inline std::string definition_text(const Pipeline& p) {
  std::vector<hir::Function> order;
  std::set<std::string> seen;
  std::vector<hir::Function> stack = {p.out.function()};
  for (const auto* extra : {&p.acc, &p.padded, &p.side})
    if (extra->defined()) stack.push_back(extra->function());
  for (const auto& r : p.reductions) stack.push_back(r.function());
  std::reverse(stack.begin(), stack.end());  // out first
  while (!stack.empty()) {
    hir::Function f = stack.back();
    stack.pop_back();
    if (!seen.insert(f.name()).second) continue;
    order.push_back(f);
    detail::CallOrder calls;
    for (const auto& d : detail::definitions(f)) detail::visit_definition(d, calls);
    for (auto it = calls.calls.rbegin(); it != calls.calls.rend(); ++it) stack.push_back(*it);
  }
  detail::Canonical canon;
  for (const auto& f : order) canon.name(f.name(), 'f');
  std::ostringstream os;
  os << "op " << p.op << " " << p.dtype_key << " family " << int(p.family) << " dtypes "
     << int(p.in_dtype) << " " << int(p.out_dtype) << " attrs " << p.attrs << " flags "
     << p.variant_flags << " inout " << p.inout_mask << "\n";
  for (const auto& a : p.args)
    os << "arg " << a.name << " " << int(a.kind) << " " << a.type << " " << int(a.dimensions)
       << "\n";
  for (const auto* named : {&p.out, &p.acc, &p.padded, &p.side})
    os << "role " << (named->defined() ? canon.name(named->name(), 'f') : "-") << "\n";
  for (const auto& r : p.reductions) os << "reduction " << canon.name(r.name(), 'f') << "\n";
  for (const auto& v : p.vars) os << "var " << canon.name(v.name(), 'v') << "\n";
  for (const auto& f : order) {
    os << "func " << canon.name(f.name(), 'f') << "(";
    for (const auto& a : f.args()) os << canon.name(a, 'v') << ",";
    os << ")";
    for (const auto& t : f.output_types()) os << " " << t;
    os << "\n";
    if (f.has_extern_definition()) {
      os << " extern " << f.extern_function_name() << " " << f.extern_arguments().size() << "\n";
    }
    for (const auto& b : f.schedule().bounds())
      os << " bound " << canon.name(b.var, 'v') << " " << canon.mutate(b.min) << " "
         << canon.mutate(b.extent) << "\n";
    for (const auto& d : detail::definitions(f)) {
      os << " def";
      for (const auto& rv : d.schedule().rvars())
        os << " rvar " << canon.name(rv.var, 'r') << " " << canon.mutate(rv.min) << " "
           << canon.mutate(rv.extent);
      os << "\n  at";
      for (const auto& e : d.args()) os << " " << canon.mutate(e);
      os << "\n  =";
      for (const auto& e : d.values()) os << " " << canon.mutate(e);
      if (d.predicate().defined()) os << "\n  if " << canon.mutate(d.predicate());
      os << "\n";
    }
  }
  return os.str();
}

// What the compiler's sources contribute to every key: small files by name and content, large ones
// (the Halide library) by name, size and modification time. Never by path: two checkouts of the
// same sources share their kernels.
inline std::string files_fingerprint(const std::vector<std::string>& files) {
  std::string text;
  for (const auto& f : files) {
    std::error_code ec;
    auto size = fs::file_size(f, ec);
    if (ec) throw std::runtime_error("opforge-kc: cannot read key file " + f);
    text += fs::path(f).filename().string() + "\n";
    if (size > (1u << 20)) {
      auto mtime = fs::last_write_time(f).time_since_epoch().count();
      text += std::to_string(size) + " " + std::to_string(mtime) + "\n";
    } else {
      std::ifstream in(f, std::ios::binary);
      text += std::string(std::istreambuf_iterator<char>(in), {}) + "\n";
    }
  }
  return content_hash(text);
}

// Entries are <dir>/<2 hex>/<key>.o (a kernel's object) or <key>.skip (a variant the target cannot
// run, with the reason). Writes go through a temporary file and a rename, so processes that share
// the cache never see half an entry; a hit is hard-linked out, so trimming cannot pull it away.
class KernelCache {
 public:
  explicit KernelCache(std::string dir) : dir_(std::move(dir)) {}
  bool enabled() const { return !dir_.empty(); }

  // Places the cached object for `key` at `dest`; false when there is none.
  bool fetch(const std::string& key, const fs::path& dest) const {
    if (!enabled()) return false;
    fs::path entry = path(key, ".o");
    std::error_code ec;
    fs::remove(dest, ec);
    fs::create_hard_link(entry, dest, ec);
    if (ec) {
      ec.clear();
      if (!fs::copy_file(entry, dest, fs::copy_options::overwrite_existing, ec) || ec) return false;
    }
    fs::last_write_time(entry, fs::file_time_type::clock::now(), ec);  // for trimming by age
    return true;
  }
  std::optional<std::string> skipped(const std::string& key) const {
    if (!enabled()) return std::nullopt;
    std::ifstream in(path(key, ".skip"));
    if (!in) return std::nullopt;
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  void store(const std::string& key, const fs::path& object) const {
    if (enabled())
      publish(path(key, ".o"), [&](const fs::path& tmp) {
        fs::copy_file(object, tmp, fs::copy_options::overwrite_existing);
      });
  }
  void store_skip(const std::string& key, const std::string& reason) const {
    if (enabled())
      publish(path(key, ".skip"), [&](const fs::path& tmp) { std::ofstream(tmp) << reason; });
  }
  // Deletes the least recently used entries while the cache holds more than `max_bytes`.
  void trim(uintmax_t max_bytes) const {
    if (!enabled() || !fs::exists(dir_)) return;
    std::vector<std::pair<fs::file_time_type, fs::path>> entries;
    uintmax_t total = 0;
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(dir_, ec)) {
      if (!e.is_regular_file(ec)) continue;
      total += e.file_size(ec);
      entries.emplace_back(e.last_write_time(ec), e.path());
    }
    if (total <= max_bytes) return;
    std::sort(entries.begin(), entries.end());
    for (const auto& [time, file] : entries) {
      if (total <= max_bytes / 10 * 9) break;
      auto size = fs::file_size(file, ec);
      if (fs::remove(file, ec)) total -= size;
    }
  }

 private:
  fs::path path(const std::string& key, const char* ext) const {
    return fs::path(dir_) / key.substr(0, 2) / (key + ext);
  }
  template <class Write>
  void publish(const fs::path& entry, Write write) const {
    fs::create_directories(entry.parent_path());
    fs::path tmp = entry;
    tmp += ".tmp" + std::to_string(::getpid());
    write(tmp);
    fs::rename(tmp, entry);
  }
  std::string dir_;
};
}  // namespace opforge::gen
