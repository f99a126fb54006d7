// opforge-kc: the build-time kernel compiler. One process loads Halide once and builds one shard
// of one family's ops: every op x dtype x schedule variant x target, each kernel compiled alone
// or taken from the content-addressed cache (kernel_cache.hpp), joined into one object file per
// target, plus the C++ source of their registry entries. The op table comes from the header named
// by OPFORGE_OPS_HEADER (the built-in library's, or a user's for opforge_add_ops).
#include <Halide.h>

#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string_view>

#include "generators/kernel_cache.hpp"
#include "generators/pipelines.hpp"
#include "schedules/alias_safe.hpp"
#include "schedules/manual.hpp"
#include "schedules/variants.hpp"
#include OPFORGE_OPS_HEADER

namespace {
using namespace opforge;
using namespace opforge::gen;
namespace hana = boost::hana;

struct Options {
  std::string family, out_dir, unit, prefix = "opforge_k";
  int shard = 0, shards = 1;
  std::string adams, mullapudi, li2018;
  std::string linker = "ld";  // joins the GPU pipelines' objects (see below)
  std::string only_variants;  // comma list; empty = all
  bool static_init = false;
  bool cuda = false;      // also compile for CUDA
  std::string cache_dir;  // kernel_cache.hpp; empty: no cache
  uintmax_t cache_max_bytes = 4ull << 30;
  std::vector<std::string> key_files;  // sources every kernel's key includes
};

// One (op, dtype) of the requested family, built anew for each variant and target because a
// Halide pipeline can be scheduled only once.
struct KernelSource {
  std::string op, dtype_key;
  std::function<Pipeline()> build;
  // Elementwise ops: the same op over one contiguous dimension, the dense companion of the manual
  // CPU kernel (kernel_abi.hpp); empty for the other families.
  std::function<Pipeline()> build_dense;
  bool backward = false;  // a backward kernel: built in schedules::backward_variant()s only
  // Hand schedules only: an op that updates several inputs in place needs its inputs read before
  // any result is stored (schedules/elementwise.hpp), which no autoscheduler knows to keep.
  bool hand_only = false;
};

template <class Op>
void collect_op(const Op& op, dsl::Family family, std::vector<KernelSource>& out) {
  if (Op::family != family) return;
  if constexpr (std::is_same_v<Op, dsl::CastOp<std::decay_t<decltype(op.dtypes)>>>) {
    hana::for_each(op.dtypes, [&](auto from) {
      hana::for_each(op.dtypes, [&](auto to) {
        using F = typename decltype(from)::type;
        using T = typename decltype(to)::type;
        if constexpr (!std::is_same_v<F, T>) {
          DType f = dtype_of_v<F>, t = dtype_of_v<T>;
          out.push_back({"cast", std::string(dtype_name(f)) + "_to_" + std::string(dtype_name(t)),
                         [f, t] { return build_cast(f, t); },
                         [f, t] { return build_cast(f, t, 1); }});
        }
      });
    });
  } else {
    hana::for_each(op.dtypes, [&](auto type) {
      using T = typename decltype(type)::type;
      KernelSource k{op.name, dtype_str<T>(), [op, type] { return build(op, type); }, {}};
      if constexpr (Op::family == dsl::Family::elementwise) {
        k.build_dense = [op, type] { return build(op, type, 1); };
        k.hand_only = std::popcount(unsigned(op.inout_mask)) > 1;
        out.push_back(std::move(k));
        if constexpr (std::is_floating_point_v<T>)
          if (dsl::has_backward(op))
            out.push_back({backward_name(op.name), dtype_str<T>(),
                           [op, type] { return build_backward(op, type); },
                           [op, type] { return build_backward(op, type, 1); }, true});
      } else {
        if constexpr (Op::family == dsl::Family::window) k.backward = dsl::is_gradient(op.kind);
        out.push_back(std::move(k));
      }
    });
  }
}

std::string sanitize(std::string s) {
  for (auto& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

const char* scheduler_plugin(schedules::Scheduler s) {
  switch (s) {
    case schedules::Scheduler::adams2019:
      return "Adams2019";
    case schedules::Scheduler::mullapudi2016:
      return "Mullapudi2016";
    default:
      return "Li2018";
  }
}

// The autoscheduler plugin a variant needs, empty when it needs none or was not given.
const std::string& plugin_path(const Options& opt, schedules::Scheduler s) {
  static const std::string none;
  switch (s) {
    case schedules::Scheduler::adams2019:
      return opt.adams;
    case schedules::Scheduler::mullapudi2016:
      return opt.mullapudi;
    case schedules::Scheduler::li2018:
      return opt.li2018;
    default:
      return none;
  }
}

// PTX that calls a function libdevice does not define (the C library's expm1, erf, ... that the DSL
// calls for float64) cannot be loaded by the driver. Returns that declaration, empty if none.
std::string unresolved_ptx_call(const Halide::Module& m, const Halide::Target& t) {
  if (!t.has_feature(Halide::Target::CUDA)) return {};
  for (const auto& b : m.buffers()) {
    std::string_view text(reinterpret_cast<const char*>(b.data()), b.size_in_bytes());
    auto at = text.find(".extern .func");
    if (at == std::string_view::npos) continue;
    auto end = text.find('\n', at);
    return std::string(text.substr(at, end == std::string_view::npos ? end : end - at));
  }
  return {};
}

struct Emitted {
  std::string fn, op, dtype_key, variant, target;
  std::string dense_fn;  // its dense companion's entry point, empty if none
  Pipeline meta;
  std::vector<int64_t> min_extents;
};

int run(const Options& opt) {
  dsl::Family family;
  bool found = false;
  for (auto f : {dsl::Family::elementwise, dsl::Family::reduction, dsl::Family::contraction,
                 dsl::Family::window, dsl::Family::movement})
    if (opt.family == dsl::family_name(f)) family = f, found = true;
  if (!found) {
    std::cerr << "opforge-kc: unknown family '" << opt.family << "'\n";
    return 2;
  }
  std::vector<KernelSource> all;
  hana::for_each(OPFORGE_OPS_TABLE, [&](const auto& op) { collect_op(op, family, all); });
  std::vector<KernelSource> mine;
  for (size_t i = 0; i < all.size(); i++)
    if (int(i % opt.shards) == opt.shard) mine.push_back(all[i]);

  for (const auto* plugin : {&opt.adams, &opt.mullapudi, &opt.li2018})
    if (!plugin->empty()) Halide::load_plugin(*plugin);

  std::vector<Emitted> emitted;
  struct TargetVariants {
    schedules::CpuTarget target;
    std::vector<schedules::Variant> variants;
  };
  std::vector<TargetVariants> jobs;
  for (const auto& t : schedules::cpu_targets()) {
    jobs.push_back({t, {}});
    for (const auto& v : schedules::variants_for(family))
      if (!t.hand_schedules_only || v.scheduler == schedules::Scheduler::manual)
        jobs.back().variants.push_back(v);
  }
  for (const auto& t : schedules::gpu_targets(opt.cuda))
    jobs.push_back({t, schedules::gpu_variants_for(family)});
  KernelCache cache(opt.cache_dir);
  std::string sources = files_fingerprint(opt.key_files);
  int hits = 0, misses = 0;
  for (const auto& [target, variants] : jobs) {
    Halide::Target t(target.halide + (schedules::strict_float(family) ? "-strict_float" : ""));
    // Each kernel is its own object (a cache entry), joined into the unit's object with `ld -r`.
    // Halide 14 also gives every GPU pipeline's kernel source and module state the same names,
    // so GPU pipelines could not share a Module anyway.
    std::vector<std::string> parts;
    std::string parts_dir = opt.out_dir + "/" + opt.unit + "." + target.tag + ".parts";
    std::filesystem::remove_all(parts_dir);
    std::filesystem::create_directories(parts_dir);
    // Compiles one kernel into parts_dir/fn.o, or takes it from the cache; false: left out (the
    // log says why). Sets the call extents the schedule needs.
    auto compile = [&](Pipeline& p, const std::string& fn, const schedules::Variant& v, bool dense,
                       std::vector<int64_t>& min_extents, bool& hit) {
      bool manual = v.scheduler == schedules::Scheduler::manual ||
                    v.scheduler == schedules::Scheduler::gpu_manual;
      // What of schedules/variants.hpp shapes a kernel is written out here (its variant, estimate
      // and machine description; the target), so that file is in no key: adding a variant
      // compiles that variant alone.
      std::string key = content_hash(
          definition_text(p) + "variant " + v.name + " estimate " + std::to_string(v.estimate) +
          " machine " + (manual ? "" : schedules::kMachineParams) + "\ntarget " + t.to_string() +
          "\nentry " + fn + "\nsources " + sources + "\ncompiler " + __VERSION__ + "\n");
      if (auto reason = cache.skipped(key)) {
        fprintf(stderr, "opforge-kc: variant %s left out (cached): %s\n", fn.c_str(),
                reason->c_str());
        return false;
      }
      std::string object = parts_dir + "/" + fn + ".o";
      Halide::Pipeline pipeline(p.outputs());
      // Hand schedules are cheap and return the extents a schedule needs; the autoschedulers
      // (and compiling) are what the cache saves.
      if (dense)
        schedules::manual_dense(p, t);
      else if (v.scheduler == schedules::Scheduler::manual)
        min_extents = schedules::schedule_manual(p, t, v.name);
      else if (v.scheduler == schedules::Scheduler::gpu_manual)
        min_extents = schedules::schedule_gpu(p);
      else
        min_extents = p.set_estimates(v.estimate);
      hit = cache.fetch(key, object);
      if (hit) return true;
      Halide::Module m("", t);
      try {
        if (!manual)
          pipeline.auto_schedule(scheduler_plugin(v.scheduler), t,
                                 Halide::MachineParams(schedules::kMachineParams));
        // kernel_abi.hpp: an elementwise output may alias an input of the same view.
        if (family == dsl::Family::elementwise) schedules::make_alias_safe(p.out);
        m = pipeline.compile_to_module(p.args, fn, t);
      } catch (const Halide::Error& e) {
        // An autoscheduler may emit a schedule the target cannot run (Li2018 uses 8-bit
        // atomics that OpenCL lacks), or fail inside (Mullapudi2016 on leaky_relu's backward
        // kernel: an internal assertion): that variant is left out, and the log says
        // so. A hand schedule that fails is a bug.
        if (manual) throw;
        fprintf(stderr, "opforge-kc: variant %s left out: %s\n", fn.c_str(), e.what());
        cache.store_skip(key, e.what());
        return false;
      }
      if (std::string missing = unresolved_ptx_call(m, t); !missing.empty()) {
        std::string reason =
            "its PTX calls a C library function the CUDA driver cannot resolve (" + missing + ")";
        fprintf(stderr, "opforge-kc: variant %s left out: %s\n", fn.c_str(), reason.c_str());
        cache.store_skip(key, reason);
        return false;
      }
      m.compile({{Halide::OutputFileType::object, object}});
      cache.store(key, object);
      return true;
    };
    for (const auto& k : mine) {
      for (const auto& v : variants) {
        if (!opt.only_variants.empty() &&
            ("," + opt.only_variants + ",").find("," + v.name + ",") == std::string::npos)
          continue;
        bool manual = v.scheduler == schedules::Scheduler::manual ||
                      v.scheduler == schedules::Scheduler::gpu_manual;
        if (!manual && (k.hand_only || plugin_path(opt, v.scheduler).empty())) continue;
        if (k.backward && !schedules::backward_variant(family, v)) continue;
        if (const char* why = schedules::left_out_reason(
                family, v, target.tag == "opencl" || target.tag == "cuda")) {
          fprintf(stderr, "opforge-kc: variant %s of %s left out for %s: %s\n", v.name.c_str(),
                  k.op.c_str(), target.tag.c_str(), why);
          continue;
        }
        auto t0 = std::chrono::steady_clock::now();
        Pipeline p = k.build();
        std::string fn =
            sanitize(opt.prefix + "_" + k.op + "_" + k.dtype_key + "_" + v.name + "_" + target.tag);
        std::vector<int64_t> min_extents;
        bool hit = false;
        if (!compile(p, fn, v, false, min_extents, hit)) continue;
        (hit ? hits : misses)++;
        parts.push_back(parts_dir + "/" + fn + ".o");
        emitted.push_back({fn, k.op, k.dtype_key, v.name, target.tag, {}, p, min_extents});
        // The manual CPU kernel of an elementwise op also gets its dense companion.
        if (k.build_dense && v.scheduler == schedules::Scheduler::manual) {
          Pipeline dp = k.build_dense();
          std::vector<int64_t> unused;
          bool dense_hit = false;
          if (compile(dp, fn + "_dense", v, true, unused, dense_hit)) {
            (dense_hit ? hits : misses)++;
            parts.push_back(parts_dir + "/" + fn + "_dense.o");
            emitted.back().dense_fn = fn + "_dense";
          }
        }
        if (getenv("OPFORGE_KC_VERBOSE")) {
          double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          fprintf(stderr, "  %-60s %.2fs%s\n", fn.c_str(), s, hit ? " (cached)" : "");
        }
      }
    }
    std::string object = opt.out_dir + "/" + opt.unit + "." + target.tag + ".o";
    if (parts.empty()) {
      Halide::Module(sanitize(opt.unit + "_" + target.tag), t)
          .compile({{Halide::OutputFileType::object, object}});
    } else {
      std::string cmd = "\"" + opt.linker + "\" -r -o \"" + object + "\"";
      for (const auto& part : parts) cmd += " \"" + part + "\"";
      if (std::system(cmd.c_str()) != 0) {
        std::cerr << "opforge-kc: joining the " << target.tag << " objects failed: " << cmd << "\n";
        return 1;
      }
    }
    std::filesystem::remove_all(parts_dir);
  }
  fprintf(stderr, "opforge-kc: %s: %d kernels compiled, %d from the cache (%s)\n", opt.unit.c_str(),
          misses, hits, cache.enabled() ? opt.cache_dir.c_str() : "no cache");
  cache.trim(opt.cache_max_bytes);

  std::ofstream reg(opt.out_dir + "/" + opt.unit + ".registry.cpp");
  reg << "// Generated by opforge-kc for " << opt.unit << ": do not edit.\n"
      << "#include <iterator>\n#include \"opforge/kernel_abi.hpp\"\n\nextern \"C\" {\n";
  for (const auto& e : emitted) {
    reg << "int " << e.fn << "_argv(void**);\nconst struct halide_filter_metadata_t* " << e.fn
        << "_metadata();\n";
    if (!e.dense_fn.empty()) reg << "int " << e.dense_fn << "_argv(void**);\n";
  }
  // Each (op, dtype)'s buffers once, shared by its variants and targets.
  reg << "}\n\nnamespace {\nusing opforge::BufferRole;\nusing opforge::DType;\n";
  std::map<std::string, std::string> buffer_tables;  // op/dtype -> table name
  std::map<std::string, size_t> buffer_counts;
  for (const auto& e : emitted) {
    std::string key = e.op + "/" + e.dtype_key;
    if (buffer_tables.count(key)) continue;
    std::string table = "kBuffers" + std::to_string(buffer_tables.size());
    buffer_tables[key] = table;
    auto decls = gen::buffer_decls(e.meta);
    if (decls.size() > size_t(kMaxKernelBuffers))
      throw std::runtime_error(e.op + ": " + std::to_string(decls.size()) +
                               " buffers, more than kernel_abi.hpp's kMaxKernelBuffers");
    buffer_counts[key] = decls.size();
    reg << "const opforge::BufferSpec " << table << "[] = {";
    for (const auto& b : decls)
      reg << "{\"" << b.name << "\", BufferRole::" << role_name(b.role) << ", DType("
          << int(b.dtype) << "), " << b.dims << "}, ";
    reg << "};\n";
  }
  reg << "const opforge::KernelVariant kVariants[] = {\n";
  for (const auto& e : emitted) {
    std::string key = e.op + "/" + e.dtype_key;
    reg << "    {\"" << e.op << "\", \"" << dsl::family_name(e.meta.family) << "\", \""
        << e.dtype_key << "\", "
        << "opforge::DType(" << int(e.meta.in_dtype) << "), opforge::DType("
        << int(e.meta.out_dtype) << "), " << buffer_tables[key] << ", " << buffer_counts[key]
        << ", \"" << e.meta.attrs << "\", " << e.meta.variant_flags << ", \"" << e.variant
        << "\", \"" << e.target << "\", &" << e.fn << "_argv, &" << e.fn << "_metadata, {";
    for (size_t i = 0; i < e.min_extents.size(); i++) reg << (i ? ", " : "") << e.min_extents[i];
    reg << "}, " << (e.dense_fn.empty() ? "nullptr" : "&" + e.dense_fn + "_argv") << "},\n";
  }
  reg << "};\n}  // namespace\n\n";
  if (opt.static_init) {
    reg << "static const bool registered_" << sanitize(opt.unit)
        << " = (opforge::register_kernels(kVariants, std::size(kVariants)), true);\n";
  } else {
    reg << "extern \"C\" void opforge_register_" << sanitize(opt.unit) << "() {\n"
        << "  opforge::register_kernels(kVariants, std::size(kVariants));\n}\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "opforge-kc: " << a << " needs a value\n";
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--family")
      opt.family = next();
    else if (a == "--shard")
      opt.shard = std::stoi(next());
    else if (a == "--shards")
      opt.shards = std::stoi(next());
    else if (a == "--out")
      opt.out_dir = next();
    else if (a == "--unit")
      opt.unit = next();
    else if (a == "--prefix")
      opt.prefix = next();
    else if (a == "--adams")
      opt.adams = next();
    else if (a == "--mullapudi")
      opt.mullapudi = next();
    else if (a == "--li2018")
      opt.li2018 = next();
    else if (a == "--linker")
      opt.linker = next();
    else if (a == "--variants")
      opt.only_variants = next();
    else if (a == "--static-init")
      opt.static_init = true;
    else if (a == "--cuda")
      opt.cuda = true;
    else if (a == "--cache")
      opt.cache_dir = next();
    else if (a == "--cache-max-mb")
      opt.cache_max_bytes = std::stoull(next()) << 20;
    else if (a == "--key-file")
      opt.key_files.push_back(next());
    else if (a == "--runtime") {
      // The one Halide runtime every kernel library shares.
      std::string object = next();
      bool cuda = i + 1 < argc && std::string(argv[i + 1]) == "--cuda";
      Halide::compile_standalone_runtime(object, Halide::Target(schedules::runtime_target(cuda)));
      return 0;
    } else {
      std::cerr << "opforge-kc: unknown argument '" << a << "'\n"
                << "usage: opforge-kc --family F --unit NAME --out DIR [--shard I --shards N] "
                   "[--adams PLUGIN] [--mullapudi PLUGIN] [--li2018 PLUGIN] [--variants a,b] "
                   "[--static-init] [--cache DIR [--cache-max-mb N]] [--key-file F]...\n"
                   "       opforge-kc --runtime OBJECT\n";
      return 2;
    }
  }
  if (opt.unit.empty()) opt.unit = opt.family + "_" + std::to_string(opt.shard);
  try {
    return run(opt);
  } catch (const Halide::Error& e) {
    std::cerr << "opforge-kc: Halide error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "opforge-kc: " << e.what() << "\n";
    return 1;
  }
}
