// A kernel's Halide pipeline and what every family's builder shares: the kernel's arguments and
// buffers, attribute parameters, estimate helpers. The builders themselves are in
// pipeline_<family>.hpp, so that a kernel's cache key holds only its own family's builder.
#pragma once
#include <bit>
#include <functional>
#include <string>
#include <vector>

#include "opforge/dsl/op.hpp"

namespace opforge::gen {
using namespace opforge::dsl;
using Halide::Expr;
using Halide::Func;
using Halide::ImageParam;
using Halide::Var;

struct Pipeline {
  std::string op, dtype_key;
  Family family;
  DType in_dtype, out_dtype;
  int num_inputs = 0;
  std::string attrs;      // the op's attribute spec
  int variant_flags = 0;  // family-specific: ReductionKind, WindowKind, MovementKind
  std::vector<ImageParam> inputs;
  std::vector<Halide::Param<double>> float_attrs;
  std::vector<Halide::Param<int32_t>> int_attrs;
  std::vector<Halide::Argument> args;  // in ABI order: inputs, attributes
  Expr int_attr(const std::string& name) const {
    for (const auto& a : int_attrs)
      if (a.name() == name) return a;
    throw std::runtime_error("pipeline " + op + " has no integer attribute " + name);
  }
  Func out, acc;  // acc: the accumulation of contraction and window ops; out: Tuple-valued when
                  // the op has several outputs
  // Outputs of another shape than out's, after out's buffers (a Halide pipeline with several
  // output Funcs): a reduction's per-channel results, side(k), that out may read (batch_norm's
  // statistics beside the normalised tensor); their buffers are channel0, channel1, ...
  Func side;
  std::vector<Func> outputs() const {
    std::vector<Func> o{out};
    if (side.defined()) o.push_back(side);
    return o;
  }
  int inout_mask = 0;  // inputs the outputs are written into, in place (bit i: input i), in order
  Func padded;         // window: the input with its zero border
  // elementwise ops that update several inputs in place: every input of an element, read before
  // any result of it is stored (schedules/elementwise.hpp says why).
  Func staged;
  // reduction: the op's reductions over the reduced axis. Schedules place them explicitly: by
  // default Halide computes a reduction in the innermost loop of its consumer, so a normalize op
  // would recompute a row's max and sum for each element of the row, and var its mean for each
  // term of its sum.
  std::vector<Func> reductions;
  std::vector<Var> vars;  // out's pure vars, innermost first
  // Sets estimates for an autoscheduler at the given size; returns the call extents below which
  // the resulting schedule may be invalid.
  std::function<std::vector<int64_t>(int64_t size)> set_estimates;
};

inline DType dtype_of_halide(const Type& t) {
  if (t == Halide::UInt(8)) return DType::Bool;
  if (t == Halide::Int(32)) return DType::Int32;
  if (t == Halide::Int(64)) return DType::Int64;
  if (t == Halide::Float(32)) return DType::Float32;
  if (t == Halide::Float(64)) return DType::Float64;
  throw std::runtime_error("no opforge dtype for Halide type " + Halide::type_to_c_type(t, false));
}

// A kernel's buffers in declared order (kernel_abi.hpp): the inputs, one of which may be written in
// place (inout), then the outputs of `out` (several when it is Tuple-valued), then `side`'s.
struct BufferDecl {
  std::string name;
  BufferRole role;
  DType dtype;
  int dims;
};
inline std::vector<BufferDecl> buffer_decls(const Pipeline& p) {
  std::vector<BufferDecl> b;
  for (size_t i = 0; i < p.inputs.size(); i++)
    b.push_back({p.inputs[i].name(),
                 (p.inout_mask >> i) & 1 ? BufferRole::inout : BufferRole::input,
                 dtype_of_halide(p.inputs[i].type()), p.inputs[i].dimensions()});
  if (p.inout_mask) return b;
  auto types = p.out.output_types();
  for (size_t k = 0; k < types.size(); k++)
    b.push_back({types.size() == 1 ? std::string("out") : "out" + std::to_string(k),
                 BufferRole::output, dtype_of_halide(types[k]), p.out.dimensions()});
  if (!p.side.defined()) return b;
  types = p.side.output_types();
  for (size_t k = 0; k < types.size(); k++)
    b.push_back({"channel" + std::to_string(k), BufferRole::output, dtype_of_halide(types[k]),
                 p.side.dimensions()});
  return b;
}

namespace detail {
inline Attrs make_attrs(Pipeline& p, const char* spec, Type type) {
  Attrs a;
  for (const auto& s : parse_attr_spec(spec)) {
    a.names.push_back(s.name);
    if (s.integer) {
      p.int_attrs.emplace_back(s.name);
      a.values.push_back(p.int_attrs.back());
      p.args.push_back(p.int_attrs.back());
    } else {
      p.float_attrs.emplace_back(s.name);
      a.values.push_back(Halide::cast(type, p.float_attrs.back()));
      p.args.push_back(p.float_attrs.back());
    }
  }
  return a;
}

inline ImageParam add_input(Pipeline& p, Type t, int dims, const std::string& name,
                            bool any_stride) {
  ImageParam in(t, dims, name);
  if (any_stride) in.dim(0).set_stride(Expr());
  p.inputs.push_back(in);
  p.args.push_back(in);
  return in;
}

inline void estimate_attrs(Pipeline& p, int64_t int_value) {
  for (auto& f : p.float_attrs) f.set_estimate(1.0);
  for (auto& i : p.int_attrs) i.set_estimate(int32_t(int_value));
}

inline std::vector<Halide::Range> ranges(const std::vector<int64_t>& extents) {
  std::vector<Halide::Range> r;
  for (auto e : extents) r.emplace_back(0, int32_t(e));
  return r;
}

constexpr int kEwDims = 6;

// A derived gradient of a pointwise op as one expression at `at`. propagate_adjoints clamps every
// access to the output's bounds and marks it `likely`, which Halide answers by partitioning each
// of the six loops (several times the code and compile time of the forward kernel); a pointwise
// op reads every buffer at the point it writes, so the clamps are the identity and are dropped.
class AtPoint : public Halide::Internal::IRMutator {
 public:
  explicit AtPoint(std::vector<Expr> at) : at_(std::move(at)) {}
  using IRMutator::mutate;

 protected:
  using IRMutator::visit;
  // A Func is inlined at the point; a buffer is read at it.
  Expr visit(const Halide::Internal::Call* op) override {
    namespace hir = Halide::Internal;
    if (op->call_type == hir::Call::Halide && op->func.defined()) {
      hir::Function fn(op->func);
      if (fn.has_update_definition() || fn.args().size() != at_.size())
        throw std::runtime_error("derived gradient is not pointwise: " + fn.name());
      Expr v = fn.values()[size_t(op->value_index)];
      for (size_t k = 0; k < at_.size(); k++) v = hir::substitute(fn.args()[k], at_[k], v);
      return mutate(v);
    }
    if (op->call_type != hir::Call::Image || op->args.size() != at_.size())
      return IRMutator::visit(op);
    return hir::Call::make(op->type, op->name, at_, op->call_type, op->func, op->value_index,
                           op->image, op->param);
  }

 private:
  std::vector<Expr> at_;
};
inline Expr pointwise(const Func& f, const std::vector<Var>& vars) {
  std::vector<Expr> at(vars.begin(), vars.end());
  return Halide::Internal::simplify(AtPoint(at).mutate(f(at)));
}

// Estimates of the 6-D strided kernels: `size` elements in the innermost dimension.
inline std::vector<int64_t> estimate_6d(Pipeline& p, int64_t size) {
  std::vector<int64_t> ext(kEwDims, 1);
  ext[0] = size;
  for (auto& in : p.inputs) in.set_estimates(ranges(ext));
  p.out.set_estimates(ranges(ext));
  estimate_attrs(p, 1);
  return ext;
}
}  // namespace detail

template <class T>
std::string dtype_str() {
  return std::string(dtype_name(dtype_of_v<T>));
}

// The fields every family's pipeline starts with.
template <class T, class Op>
Pipeline start(const Op& op, int num_inputs, int flags = 0) {
  Pipeline p;
  p.op = op.name;
  p.family = Op::family;
  p.in_dtype = dtype_of_v<T>;
  p.out_dtype = op.out(p.in_dtype);
  p.dtype_key = dtype_str<T>();
  p.num_inputs = num_inputs;
  p.attrs = op.attrs;
  p.variant_flags = flags;
  return p;
}

}  // namespace opforge::gen
