// The benchmarks of `opforge bench`. Each times opforge and its peer in this process, the median
// of several repeats, after checking once that both computed the same thing.
#include "peers.hpp"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cublas.hpp"
#include "opforge/device.hpp"
#include "opforge/dispatch.hpp"
#include "opforge/ops.hpp"
#include "opforge/registry.hpp"
#include "opforge/tensor.hpp"
#include "timing.hpp"
#include "torch_peer.hpp"

#ifdef OPFORGE_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace opforge::cli {
namespace {

using Fn = std::function<void()>;

// Stores into a buffer that nobody reads afterwards may otherwise be dropped by the optimiser.
inline void keep_memory(const void* p) { asm volatile("" : : "g"(p) : "memory"); }

double time_batch(const Fn& fn, int64_t calls) {
  const double t0 = now_seconds();
  for (int64_t i = 0; i < calls; ++i) fn();
  synchronize();  // with asynchronous devices, calls return before their kernels finish
  return now_seconds() - t0;
}

// OpenBLAS and OpenMP workers spin for a while after their last job before they sleep; timing
// one side while the other side's pool still spins would charge it for cores it cannot use.
void let_thread_pools_idle() { std::this_thread::sleep_for(std::chrono::milliseconds(150)); }

// Calls per timed batch so that one lasts about repeat_seconds: the clock's resolution and cost
// then vanish even for calls of a microsecond.
int64_t batch_calls(const Fn& fn, const BenchOptions& o) {
  int64_t calls = 1;
  double t = time_batch(fn, calls);
  while (t < o.repeat_seconds / 4 && calls < (int64_t(1) << 40)) {
    calls *= 2;
    t = time_batch(fn, calls);
  }
  return std::max<int64_t>(1, std::llround(double(calls) * o.repeat_seconds / std::max(t, 1e-9)));
}

// Median seconds per call of each side. Repeats alternate between the sides, so a drift in
// machine load or clock speed during the run falls on all of them alike.
std::vector<double> seconds_per_call(const std::vector<Fn>& sides, const BenchOptions& o) {
  std::vector<int64_t> calls;
  for (const Fn& fn : sides) {
    let_thread_pools_idle();
    calls.push_back(batch_calls(fn, o));
  }
  std::vector<std::vector<double>> per_call(sides.size());
  for (int r = 0; r < o.repeats; ++r) {
    for (size_t i = 0; i < sides.size(); ++i) {
      if (sides.size() > 1) let_thread_pools_idle();
      per_call[i].push_back(time_batch(sides[i], calls[i]) / double(calls[i]));
    }
  }
  std::vector<double> medians;
  for (auto& v : per_call) medians.push_back(median(std::move(v)));
  return medians;
}

void warm_up(const Fn& fn, int calls) {
  for (int i = 0; i < calls; ++i) fn();
}

// Calls enough for the dispatcher to calibrate a new shape bucket before the clock starts: it
// times each eligible variant calibration_runs times. The CLI never changes the policy, so the
// default is the one in force (there is no getter for the current policy).
int calibration_calls(const std::string& op) {
  size_t variants = 1;
  if (const OpInfo* info = find_op(op)) {
    for (const auto& [key, group] : info->groups)
      variants = std::max(variants, group.variants.size());
  }
  return DispatchPolicy{}.calibration_runs * int(variants) + 2;
}

// Row-major float32 values of a tensor, whatever its layout.
std::vector<float> float_values(const Tensor& t) {
  OPFORGE_CHECK(t.dtype() == DType::Float32)
      << "bench: expected a float32 result, got " << dtype_name(t.dtype());
  std::vector<float> v(static_cast<size_t>(t.numel()));
  t.copy_to_host(v.data(), v.size() * sizeof(float));
  return v;
}

// A fast wrong answer must not post a number: opforge's result has to match the peer's within
// rtol of the largest reference magnitude (summation order differs between libraries).
template <class Ref>
void check_close(const std::string& bench, const std::string& peer, const std::vector<float>& got,
                 const std::vector<Ref>& ref, double rtol) {
  OPFORGE_CHECK(got.size() == ref.size()) << bench << ": opforge gave " << got.size()
                                          << " values to compare, " << peer << " " << ref.size();
  double scale = 1;
  for (Ref r : ref) scale = std::max(scale, std::abs(double(r)));
  const double allowed = rtol * scale;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::abs(double(got[i]) - double(ref[i]));
    OPFORGE_CHECK(diff <= allowed)  // also false for NaN
        << bench << ": opforge and " << peer << " disagree at element " << i << ": " << got[i]
        << " vs " << double(ref[i]) << " (difference " << diff << ", allowed " << allowed << ")";
  }
}

void check_shape(const std::string& bench, const Tensor& t, const Shape& expected) {
  OPFORGE_CHECK(t.shape() == expected)
      << bench << ": opforge returned shape " << shape_str(t.shape()) << ", expected "
      << shape_str(expected);
}

BenchResult make_result(const std::string& name, const std::string& unit, double ours,
                        const std::string& peer_name, double peer) {
  BenchResult r{name, unit, ours, peer_name, peer, 0, ""};
  if (ours > 0 && peer > 0) r.ratio = higher_is_better(unit) ? ours / peer : peer / ours;
  return r;
}

// Times both sides and reports their GFLOP/s for `flop` operations per call.
BenchResult gflops_result(const std::string& name, double flop, const Fn& ours,
                          const std::string& peer_name, const Fn& peer, const BenchOptions& o) {
  const std::vector<double> t = seconds_per_call({ours, peer}, o);
  return make_result(name, "GFLOP/s", flop / t[0] * 1e-9, peer_name, flop / t[1] * 1e-9);
}

BenchResult bench_matmul(int64_t n, const BenchOptions& o) {
  const std::string name = "matmul_f32_" + std::to_string(n);
  const std::string peer_name = "openblas_sgemm";
  Generator gen(static_cast<uint64_t>(n));
  const Tensor a = Tensor::randn({n, n}, DType::Float32, gen);
  const Tensor b = Tensor::randn({n, n}, DType::Float32, gen);
  const std::vector<float> ha = float_values(a), hb = float_values(b);
  std::vector<float> hc(size_t(n * n));
  const int ni = int(n);
  const Fn peer = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, ha.data(), ni,
                hb.data(), ni, 0.0f, hc.data(), ni);
  };
  Tensor c;
  const Fn ours = [&] { c = matmul(a, b); };

  warm_up(peer, 2);
  warm_up(ours, calibration_calls("matmul"));
  check_shape(name, c, {n, n});
  check_close(name, peer_name, float_values(c), hc, 1e-3);

  return gflops_result(name, 2.0 * double(n) * double(n) * double(n), ours, peer_name, peer, o);
}

BenchResult bench_add_16m(const BenchOptions& o) {
  const std::string name = "add_f32_16M";
  constexpr int64_t n = int64_t(16) << 20;
  Generator gen(16);
  const Tensor a = Tensor::rand({n}, DType::Float32, gen);
  const Tensor b = Tensor::rand({n}, DType::Float32, gen);
  Tensor c;
  // A fresh output per call, as users write it; the allocator's cache is part of what we measure.
  const Fn ours = [&] { c = add(a, b); };
  warm_up(ours, calibration_calls("add"));
  check_shape(name, c, {n});

  const std::vector<float> src = float_values(a);
  const std::vector<float> hb = float_values(b);
  {
    std::vector<float> sum(src.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = src[i] + hb[i];
    check_close(name, "a reference loop", float_values(c), sum, 1e-6);
  }

  // The peer: a STREAM-style add loop over as many threads as opforge's kernels use (one per
  // core), writing a preallocated array: what a hand-written loop reaches on this machine.
  std::vector<float> dst(src.size());
  const int threads = std::max(1, num_cpu_cores(true));
  const Fn stream_add = [&] {
    auto part = [&](int t) {
      const size_t lo = src.size() * size_t(t) / size_t(threads);
      const size_t hi = src.size() * size_t(t + 1) / size_t(threads);
      const float* x = src.data();
      const float* y = hb.data();
      float* z = dst.data();
      for (size_t i = lo; i < hi; ++i) z[i] = x[i] + y[i];
    };
    std::vector<std::thread> helpers;
    for (int t = 1; t < threads; ++t) helpers.emplace_back(part, t);
    part(0);
    for (auto& h : helpers) h.join();
    keep_memory(dst.data());
  };
  warm_up(stream_add, 2);
  const double add_bytes = 3.0 * sizeof(float) * double(n);  // read a, read b, write c
  const std::vector<double> t = seconds_per_call({ours, stream_add}, o);
  return make_result(name, "GB/s", add_bytes / t[0] * 1e-9,
                     "stream_add_" + std::to_string(threads) + "threads", add_bytes / t[1] * 1e-9);
}

struct ConvShape {
  int64_t n, c, h, w, oc, kh, kw, pad;
  int64_t oh() const { return h + 2 * pad - kh + 1; }
  int64_t ow() const { return w + 2 * pad - kw + 1; }
};

// Checks a spread of output elements against a direct loop in double precision: oneDNN may be
// absent, and a full naive convolution would take longer than the benchmark.
void check_conv_samples(const std::string& name, const ConvShape& s, const std::vector<float>& y,
                        const std::vector<float>& x, const std::vector<float>& w,
                        const std::vector<float>& bias) {
  constexpr size_t kSamples = 4096;
  const size_t total = y.size();
  std::vector<float> got;
  std::vector<double> ref;
  for (size_t i = 0; i < kSamples; ++i) {
    // A stride coprime with the size visits every batch, channel and border region.
    const size_t idx = (i * 1000003 + 17) % total;
    const int64_t ox = int64_t(idx) % s.ow(), oy = int64_t(idx) / s.ow() % s.oh();
    const int64_t oc = int64_t(idx) / (s.ow() * s.oh()) % s.oc;
    const int64_t nb = int64_t(idx) / (s.ow() * s.oh() * s.oc);
    double acc = bias[size_t(oc)];
    for (int64_t ic = 0; ic < s.c; ++ic) {
      for (int64_t ky = 0; ky < s.kh; ++ky) {
        for (int64_t kx = 0; kx < s.kw; ++kx) {
          const int64_t iy = oy + ky - s.pad, ix = ox + kx - s.pad;
          if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
          acc += double(x[size_t(((nb * s.c + ic) * s.h + iy) * s.w + ix)]) *
                 double(w[size_t(((oc * s.c + ic) * s.kh + ky) * s.kw + kx)]);
        }
      }
    }
    got.push_back(y[idx]);
    ref.push_back(acc);
  }
  check_close(name, "a direct convolution loop", got, ref, 1e-3);
}

BenchResult bench_conv2d_resnet(const BenchOptions& o) {
  const std::string name = "conv2d_f32_resnet3x3";
  const ConvShape s{8, 64, 56, 56, 64, 3, 3, 1};
  const Shape out_shape{s.n, s.oc, s.oh(), s.ow()};
  Generator gen(3);
  const Tensor x = Tensor::randn({s.n, s.c, s.h, s.w}, DType::Float32, gen);
  const Tensor w = Tensor::randn({s.oc, s.c, s.kh, s.kw}, DType::Float32, gen);
  const Tensor bias = Tensor::randn({s.oc}, DType::Float32, gen);
  Conv2dOptions opt;
  opt.padding = {s.pad, s.pad};
  Tensor y;
  const Fn ours = [&] { y = conv2d(x, w, bias, opt); };
  warm_up(ours, calibration_calls("conv2d"));
  check_shape(name, y, out_shape);
  const std::vector<float> hx = float_values(x), hw = float_values(w);
  const std::vector<float> hbias = float_values(bias), hy = float_values(y);
  check_conv_samples(name, s, hy, hx, hw, hbias);

  const double flop = 2.0 * double(s.n * s.oc * s.oh() * s.ow() * s.c * s.kh * s.kw);

#ifdef OPFORGE_HAVE_DNNL
  // Plain nchw/oihw on both sides: that is the layout opforge takes, so a user switching
  // libraries would hand oneDNN the same buffers (blocked layouts would add reorders).
  using dnnl::memory;
  const std::string peer_name = "onednn";
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc src_md({s.n, s.c, s.h, s.w}, memory::data_type::f32, memory::format_tag::nchw);
  const memory::desc w_md({s.oc, s.c, s.kh, s.kw}, memory::data_type::f32,
                          memory::format_tag::oihw);
  const memory::desc b_md({s.oc}, memory::data_type::f32, memory::format_tag::x);
  const memory::desc dst_md({s.n, s.oc, s.oh(), s.ow()}, memory::data_type::f32,
                            memory::format_tag::nchw);
  const memory::dims strides{1, 1}, padding{s.pad, s.pad};
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::convolution_forward::primitive_desc pd(engine, dnnl::prop_kind::forward_inference,
                                                     dnnl::algorithm::convolution_direct, src_md,
                                                     w_md, b_md, dst_md, strides, padding, padding);
#else
  const dnnl::convolution_forward::desc desc(dnnl::prop_kind::forward_inference,
                                             dnnl::algorithm::convolution_direct, src_md, w_md,
                                             b_md, dst_md, strides, padding, padding);
  const dnnl::convolution_forward::primitive_desc pd(desc, engine);
#endif
  const dnnl::convolution_forward conv(pd);
  // oneDNN only reads src, weights and bias; its API takes non-const handles.
  std::vector<float> src_buf = hx, w_buf = hw, b_buf = hbias;
  std::vector<float> dst_buf(hy.size());
  const std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(src_md, engine, src_buf.data())},
      {DNNL_ARG_WEIGHTS, memory(w_md, engine, w_buf.data())},
      {DNNL_ARG_BIAS, memory(b_md, engine, b_buf.data())},
      {DNNL_ARG_DST, memory(dst_md, engine, dst_buf.data())}};
  const Fn peer = [&] {
    conv.execute(stream, args);
    stream.wait();
  };
  warm_up(peer, 2);
  check_close(name, peer_name, hy, dst_buf, 1e-3);
  return gflops_result(name, flop, ours, peer_name, peer, o);
#else
  return make_result(name, "GFLOP/s", flop / seconds_per_call({ours}, o)[0] * 1e-9, "none", 0);
#endif
}

#ifdef OPFORGE_HAVE_DNNL
// A oneDNN primitive from src to dst against opforge's call `ours`, both in GB/s of `bytes`; the
// primitive's result must first match the reference.
template <class Ref>
BenchResult onednn_bandwidth(const std::string& name, const dnnl::primitive& prim,
                             const dnnl::engine& engine, const dnnl::memory::desc& src_md,
                             const dnnl::memory::desc& dst_md, std::vector<float> src,
                             const std::vector<Ref>& ref, double rtol, const Fn& ours, double bytes,
                             const BenchOptions& o) {
  const std::string peer_name = "onednn";
  dnnl::stream stream(engine);
  std::vector<float> dst(ref.size());
  const std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(src_md, engine, src.data())},
      {DNNL_ARG_DST, dnnl::memory(dst_md, engine, dst.data())}};
  const Fn peer = [&] {
    prim.execute(stream, args);
    stream.wait();
  };
  warm_up(peer, 2);
  check_close(name, peer_name, dst, ref, rtol);
  const std::vector<double> t = seconds_per_call({ours, peer}, o);
  return make_result(name, "GB/s", bytes / t[0] * 1e-9, peer_name, bytes / t[1] * 1e-9);
}
#endif

// Softmax over rows as long as a language model's vocabulary: oneDNN's softmax on the same rows.
BenchResult bench_softmax_rows(const BenchOptions& o) {
  const std::string name = "softmax_f32_64x32000";
  constexpr int64_t rows = 64, cols = 32000;
  Generator gen(7);
  const Tensor x = Tensor::randn({rows, cols}, DType::Float32, gen);
  Tensor y;
  const Fn ours = [&] { y = softmax(x, 1); };
  warm_up(ours, calibration_calls("softmax"));
  check_shape(name, y, {rows, cols});
  const std::vector<float> hx = float_values(x), hy = float_values(y);
  std::vector<float> ref(hx.size());
  for (int64_t r = 0; r < rows; r++) {
    const float* row = hx.data() + r * cols;
    double m = *std::max_element(row, row + cols), total = 0;
    for (int64_t c = 0; c < cols; c++) total += std::exp(double(row[c]) - m);
    for (int64_t c = 0; c < cols; c++)
      ref[size_t(r * cols + c)] = float(std::exp(double(row[c]) - m) / total);
  }
  check_close(name, "a float64 reference loop", hy, ref, 1e-4);
  const double bytes = 2.0 * sizeof(float) * double(rows * cols);  // read x, write y

#ifdef OPFORGE_HAVE_DNNL
  using dnnl::memory;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const memory::desc md({rows, cols}, memory::data_type::f32, memory::format_tag::ab);
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::softmax_forward::primitive_desc pd(engine, dnnl::prop_kind::forward_inference,
                                                 dnnl::algorithm::softmax_accurate, md, md, 1);
#else
  const dnnl::softmax_forward::desc desc(dnnl::prop_kind::forward_inference, md, 1);
  const dnnl::softmax_forward::primitive_desc pd(desc, engine);
#endif
  return onednn_bandwidth(name, dnnl::softmax_forward(pd), engine, md, md, hx, ref, 1e-4, ours,
                          bytes, o);
#else
  return make_result(name, "GB/s", bytes / seconds_per_call({ours}, o)[0] * 1e-9, "none", 0);
#endif
}

// A sum over one axis of a 4096 x 4096 matrix (axis 1: along contiguous rows; axis 0: across
// them): oneDNN's reduction on the same matrix.
BenchResult bench_sum_axis(int axis, const BenchOptions& o) {
  const std::string name = std::string("sum_f32_4096x4096_axis") + (axis ? "1" : "0");
  constexpr int64_t n = 4096;
  Generator gen(11);
  const Tensor x = Tensor::randn({n, n}, DType::Float32, gen);
  Tensor y;
  const Fn ours = [&] { y = sum(x, {axis}); };
  warm_up(ours, calibration_calls("sum"));
  check_shape(name, y, {n});
  const std::vector<float> hx = float_values(x), hy = float_values(y);
  std::vector<double> wide(size_t(n), 0.0);
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < n; c++) wide[size_t(axis ? r : c)] += double(hx[size_t(r * n + c)]);
  check_close(name, "a float64 reference loop", hy, wide, 1e-4);
  const double bytes = sizeof(float) * double(n * n);  // read x

#ifdef OPFORGE_HAVE_DNNL
  using dnnl::memory;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const memory::desc src_md({n, n}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc dst_md(axis ? memory::dims{n, 1} : memory::dims{1, n}, memory::data_type::f32,
                            memory::format_tag::ab);
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::reduction::primitive_desc pd(engine, dnnl::algorithm::reduction_sum, src_md, dst_md,
                                           0.f, 0.f);
#else
  const dnnl::reduction::desc desc(dnnl::algorithm::reduction_sum, src_md, dst_md, 0.f, 0.f);
  const dnnl::reduction::primitive_desc pd(desc, engine);
#endif
  return onednn_bandwidth(name, dnnl::reduction(pd), engine, src_md, dst_md, hx, wide, 1e-3, ours,
                          bytes, o);
#else
  return make_result(name, "GB/s", bytes / seconds_per_call({ours}, o)[0] * 1e-9, "none", 0);
#endif
}

// On cuda:0, with the operands resident there: opforge's CUDA kernels against cuBLAS sgemm. Both
// sides wait for the GPU after every call (opforge's queued GPU calls do), so each figure is one
// call's time.
BenchResult bench_cuda_matmul(int64_t n, const BenchOptions& o) {
  const std::string name = "cuda_matmul_f32_" + std::to_string(n);
  const std::string peer_name = "cublas_sgemm";
  const Device gpu{DeviceKind::cuda, 0};
  Generator gen(static_cast<uint64_t>(n));
  const Tensor a = to_device(Tensor::randn({n, n}, DType::Float32, gen), gpu);
  const Tensor b = to_device(Tensor::randn({n, n}, DType::Float32, gen), gpu);
  CuBlas cublas;
  const float* da = cublas.upload(float_values(a));
  const float* db = cublas.upload(float_values(b));
  float* dc = cublas.alloc(size_t(n * n));
  const int ni = int(n);
  const Fn peer = [&] {
    cublas.sgemm(ni, ni, ni, da, db, dc);
    cublas.sync();
  };
  Tensor c;
  const Fn ours = [&] { c = matmul(a, b); };

  warm_up(peer, 2);
  warm_up(ours, calibration_calls("matmul"));
  check_shape(name, c, {n, n});
  OPFORGE_CHECK(c.device() == gpu) << name << ": the result is on " << c.device().str();
  check_close(name, peer_name, float_values(c), cublas.download(dc, size_t(n * n)), 1e-3);

  return gflops_result(name, 2.0 * double(n) * double(n) * double(n), ours, peer_name, peer, o);
}

// Elementwise add of resident operands against the device's copy bandwidth (cudaMemcpy from device
// to device), the ceiling of a memory-bound kernel.
BenchResult bench_cuda_add_16m(const BenchOptions& o) {
  const std::string name = "cuda_add_f32_16M";
  constexpr int64_t n = int64_t(16) << 20;
  const Device gpu{DeviceKind::cuda, 0};
  Generator gen(16);
  const Tensor ha = Tensor::rand({n}, DType::Float32, gen),
               hb = Tensor::rand({n}, DType::Float32, gen);
  const Tensor a = to_device(ha, gpu), b = to_device(hb, gpu);
  Tensor c;
  const Fn ours = [&] { c = add(a, b); };
  warm_up(ours, calibration_calls("add"));
  check_shape(name, c, {n});
  {
    const std::vector<float> av = float_values(ha), bv = float_values(hb);
    std::vector<float> sum(av.size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = av[i] + bv[i];
    check_close(name, "a reference loop", float_values(c), sum, 1e-6);
  }
  CuBlas cuda;
  const float* src = cuda.upload(float_values(ha));
  float* dst = cuda.alloc(size_t(n));
  const Fn copy = [&] {
    cuda.copy(src, dst, size_t(n));
    cuda.sync();
  };
  warm_up(copy, 2);
  const double add_bytes = 3.0 * sizeof(float) * double(n);
  const double copy_bytes = 2.0 * sizeof(float) * double(n);
  const std::vector<double> t = seconds_per_call({ours, copy}, o);
  return make_result(name, "GB/s", add_bytes / t[0] * 1e-9, "cuda_memcpy_d2d",
                     copy_bytes / t[1] * 1e-9);
}

BenchResult bench_dispatch_add_4(const BenchOptions& o) {
  Generator gen(4);
  const Tensor a = Tensor::rand({4}, DType::Float32, gen);
  const Tensor b = Tensor::rand({4}, DType::Float32, gen);
  Tensor c;
  const Fn ours = [&] { c = add(a, b); };
  // Beyond calibration, enough calls to settle the allocator's cache and the branch predictors.
  warm_up(ours, calibration_calls("add") + 1000);
  check_shape("dispatch_add_4", c, {4});
#ifdef OPFORGE_HAVE_LIBTORCH
  // torch::add of two 4-element float32 tensors, measured in the same run, alternating with ours.
  const Fn theirs = torch_add_4(num_cpu_cores(true));
  warm_up(theirs, 1000);
  const std::vector<double> t = seconds_per_call({ours, theirs}, o);
  return make_result("dispatch_add_4", "us/call", t[0] * 1e6, "libtorch_add", t[1] * 1e6);
#else
  return make_result("dispatch_add_4", "us/call", seconds_per_call({ours}, o)[0] * 1e6,
                     "none (libtorch not found at configure time)", 0);
#endif
}

// A training step's row against libtorch's step (`theirs_for(threads, y)` makes it with opforge's
// thread count; y gets its first result, checked against ours, `y`), timed alternately. Without
// libtorch (no `theirs_for`), ours alone.
using TorchStep = std::function<Fn(int threads, std::vector<float>& y)>;
BenchResult step_against_torch(const std::string& name, const Fn& ours, const Tensor& y,
                               const std::string& peer_name, const TorchStep& theirs_for,
                               const BenchOptions& o) {
  if (!theirs_for)
    return make_result(name, "us/call", seconds_per_call({ours}, o)[0] * 1e6,
                       "none (libtorch not found at configure time)", 0);
  std::vector<float> theirs_y;
  const Fn theirs = theirs_for(num_cpu_cores(true), theirs_y);
  check_close(name, "libtorch", float_values(y.detach()), theirs_y, 1e-4);
  warm_up(theirs, 2);
  const std::vector<double> t = seconds_per_call({ours, theirs}, o);
  return make_result(name, "us/call", t[0] * 1e6, peer_name, t[1] * 1e6);
}

#ifdef OPFORGE_HAVE_LIBTORCH
// step_against_torch's peer: libtorch's training step `step` (torch_peer.hpp) on x's values, of
// x's shape, with gradient g.
template <size_t R>
TorchStep libtorch_step(std::function<void()> (*step)(const std::vector<float>&,
                                                      const std::vector<float>&,
                                                      std::array<int64_t, R>, int,
                                                      std::vector<float>&),
                        const Tensor& x, const Tensor& g) {
  return [step, &x, &g](int threads, std::vector<float>& theirs_y) {
    std::array<int64_t, R> shape{};
    std::copy_n(x.shape().begin(), R, shape.begin());
    return step(float_values(x.detach()), float_values(g), shape, threads, theirs_y);
  };
}
#endif

// One training step of layer normalisation over rows of 1024 (a transformer's hidden size), 512
// rows: the forward and the backward for x, the weight and the bias, against libtorch's
// torch::layer_norm and autograd with the same threads.
BenchResult bench_layer_norm_step(const BenchOptions& o) {
  const std::string name = "layer_norm_step_f32_512x1024";
  const Shape shape{512, 1024};
  Generator gen(6);
  Tensor x = Tensor::randn(shape, DType::Float32, gen).requires_grad_();
  const Tensor g = Tensor::randn(shape, DType::Float32, gen);
  Tensor w = Tensor::ones({1024}, DType::Float32).requires_grad_();
  Tensor b = Tensor::zeros({1024}, DType::Float32).requires_grad_();
  Tensor y;
  const Fn ours = [&] {
    for (Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
    y = layer_norm(x, {1024}, w, b);
    y.backward(g);
  };
  warm_up(ours, calibration_calls("layer_norm"));
  check_shape(name, y, shape);
  TorchStep theirs;
#ifdef OPFORGE_HAVE_LIBTORCH
  theirs = libtorch_step(torch_layer_norm_step, x, g);
#endif
  return step_against_torch(name, ours, y, "libtorch_layer_norm", theirs, o);
}

// One training step of batch normalisation at the CNN's first layer's size (batch 128, 32
// channels of 24 x 24): the forward in training (statistics, running statistics, normalisation)
// and the backward for x, the weight and the bias, against libtorch's torch::batch_norm and
// autograd with the same threads.
BenchResult bench_batch_norm_step(const BenchOptions& o) {
  const std::string name = "batch_norm_train_f32_128x32x24x24";
  const Shape shape{128, 32, 24, 24};
  Generator gen(5);
  Tensor x = Tensor::randn(shape, DType::Float32, gen).requires_grad_();
  const Tensor g = Tensor::randn(shape, DType::Float32, gen);
  Tensor w = Tensor::ones({32}, DType::Float32).requires_grad_();
  Tensor b = Tensor::zeros({32}, DType::Float32).requires_grad_();
  const Tensor rm = Tensor::zeros({32}, DType::Float32), rv = Tensor::ones({32}, DType::Float32);
  Tensor y;
  const Fn ours = [&] {
    for (Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
    y = batch_norm(x, rm, rv, w, b, true);
    y.backward(g);
  };
  warm_up(ours, calibration_calls("batch_norm"));
  check_shape(name, y, shape);
  TorchStep theirs;
#ifdef OPFORGE_HAVE_LIBTORCH
  theirs = libtorch_step(torch_batch_norm_step, x, g);
#endif
  return step_against_torch(name, ours, y, "libtorch_batch_norm", theirs, o);
}

// One training step of the CNN's first 2x2 max pool (batch 128, 32 channels of 24 x 24): the
// forward, which saves each window's index, and the gradient from them, against libtorch's
// torch::max_pool2d and autograd with the same threads.
BenchResult bench_max_pool2d_step(const BenchOptions& o) {
  const std::string name = "max_pool2d_step_f32_128x32x24x24";
  const Shape shape{128, 32, 24, 24};
  Generator gen(7);
  Tensor x = Tensor::randn(shape, DType::Float32, gen).requires_grad_();
  const Tensor g = Tensor::randn({128, 32, 12, 12}, DType::Float32, gen);
  Tensor y;
  const Fn ours = [&] {
    x.set_grad(Tensor());
    y = max_pool2d(x, Pool2dOptions{});
    y.backward(g);
  };
  warm_up(ours, calibration_calls("max_pool2d_with_indices"));
  check_shape(name, y, {128, 32, 12, 12});
  TorchStep theirs;
#ifdef OPFORGE_HAVE_LIBTORCH
  theirs = libtorch_step(torch_max_pool2d_step, x, g);
#endif
  return step_against_torch(name, ours, y, "libtorch_max_pool2d", theirs, o);
}

// Two threads calling tiny ops at once, against one thread: how the per-call path scales when it
// takes no lock another call holds. Each thread makes its own tensors and calibrates its bucket
// before the clock starts; throughput in million calls per second (ratio > 1: two threads do more).
BenchResult bench_dispatch_2threads(const BenchOptions& o) {
  auto run = [](int threads, int64_t calls) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++)
      pool.emplace_back([&, t] {
        Generator gen(uint64_t(10 + t));
        const Tensor a = Tensor::rand({4}, DType::Float32, gen);
        const Tensor b = Tensor::rand({4}, DType::Float32, gen);
        Tensor c;
        for (int i = 0; i < calibration_calls("add") + 1000; i++) c = add(a, b);
        ready++;
        while (!go.load()) std::this_thread::yield();
        for (int64_t i = 0; i < calls; i++) c = add(a, b);
      });
    while (ready.load() < threads) std::this_thread::yield();
    auto t0 = std::chrono::steady_clock::now();
    go = true;
    for (auto& th : pool) th.join();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Calls per thread for a repeat of about repeat_seconds on one thread.
  int64_t calls = 1000;
  while (run(1, calls) < o.repeat_seconds && calls < (int64_t(1) << 30)) calls *= 2;
  std::vector<double> one, two;
  for (int r = 0; r < o.repeats; r++) {
    let_thread_pools_idle();
    one.push_back(double(calls) / run(1, calls) * 1e-6);
    let_thread_pools_idle();
    two.push_back(2.0 * double(calls) / run(2, calls) * 1e-6);
  }
  return make_result("dispatch_2threads", "Mcalls/s", median(std::move(two)), "one_thread",
                     median(std::move(one)));
}

// For each op called since the last reset, the variant that ran most often.
std::string chosen_variants() {
  std::map<std::string, std::pair<int64_t, std::string>> best;
  for (const DispatchStat& st : dispatch_stats()) {
    auto& b = best[st.op];
    if (st.calls > b.first) b = {st.calls, st.variant};
  }
  std::string out;
  for (const auto& [op, b] : best) out += (out.empty() ? "" : ", ") + op + "/" + b.second;
  return out;
}

struct Benchmark {
  std::string name;
  std::function<BenchResult(const BenchOptions&)> run;
};

const std::vector<Benchmark>& benchmarks() {
  static const std::vector<Benchmark> all = [] {
    std::vector<Benchmark> b = {
        {"matmul_f32_256", [](const BenchOptions& o) { return bench_matmul(256, o); }},
        {"matmul_f32_1024", [](const BenchOptions& o) { return bench_matmul(1024, o); }},
        {"matmul_f32_2048", [](const BenchOptions& o) { return bench_matmul(2048, o); }},
        {"add_f32_16M", bench_add_16m},
        {"conv2d_f32_resnet3x3", bench_conv2d_resnet},
        {"softmax_f32_64x32000", bench_softmax_rows},
        {"sum_f32_4096x4096_axis1", [](const BenchOptions& o) { return bench_sum_axis(1, o); }},
        {"sum_f32_4096x4096_axis0", [](const BenchOptions& o) { return bench_sum_axis(0, o); }},
        {"batch_norm_train_f32_128x32x24x24", bench_batch_norm_step},
        {"layer_norm_step_f32_512x1024", bench_layer_norm_step},
        {"max_pool2d_step_f32_128x32x24x24", bench_max_pool2d_step},
        {"dispatch_add_4", bench_dispatch_add_4},
        {"dispatch_2threads", bench_dispatch_2threads},
    };
    // The CUDA benchmarks where there is a GPU to run them.
    if (device_exists(Device{DeviceKind::cuda, 0})) {
      b.push_back({"cuda_matmul_f32_1024",
                   [](const BenchOptions& o) { return bench_cuda_matmul(1024, o); }});
      b.push_back({"cuda_matmul_f32_4096",
                   [](const BenchOptions& o) { return bench_cuda_matmul(4096, o); }});
      b.push_back({"cuda_add_f32_16M", bench_cuda_add_16m});
    }
    return b;
  }();
  return all;
}

}  // namespace

bool higher_is_better(const std::string& unit) {
  const std::string per_call = "/call";
  return !(unit.size() >= per_call.size() &&
           unit.compare(unit.size() - per_call.size(), per_call.size(), per_call) == 0);
}

std::vector<std::string> benchmark_names() {
  std::vector<std::string> names;
  for (const Benchmark& b : benchmarks()) names.push_back(b.name);
  return names;
}

std::vector<BenchResult> run_benchmarks(const BenchOptions& options) {
  OPFORGE_CHECK(options.repeats >= 1)
      << "bench: repeats must be at least 1, got " << options.repeats;
  OPFORGE_CHECK(options.repeat_seconds > 0)
      << "bench: repeat_seconds must be positive, got " << options.repeat_seconds;
  std::regex filter;
  try {
    filter = std::regex(options.filter);
  } catch (const std::regex_error& e) {
    throw Error("bench: invalid filter regex '" + options.filter + "': " + e.what());
  }
  std::vector<BenchResult> results;
  for (const Benchmark& b : benchmarks()) {
    if (!std::regex_search(b.name, filter)) continue;
    if (options.on_start) options.on_start(b.name);
    // Each benchmark starts from an empty performance model, so its warm-up calibrates the
    // variants for its shapes and the statistics afterwards name what the dispatcher chose.
    reset_performance_model();
    results.push_back(b.run(options));
    results.back().variant = chosen_variants();
  }
  if (results.empty()) {
    std::ostringstream names;
    for (const Benchmark& b : benchmarks()) names << (names.tellp() > 0 ? ", " : "") << b.name;
    throw Error("bench: no benchmark matches filter '" + options.filter + "'; the benchmarks are " +
                names.str());
  }
  return results;
}

}  // namespace opforge::cli
