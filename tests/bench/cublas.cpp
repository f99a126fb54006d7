// The CUDA runtime and cuBLAS entry points the benchmarks use, looked up by name.
#include "cublas.hpp"

#include <dlfcn.h>

#include <string>

#include "opforge/error.hpp"

namespace opforge::cli {

struct CuBlas::Api {
  int (*malloc)(void**, size_t) = nullptr;
  int (*free)(void*) = nullptr;
  int (*memcpy)(void*, const void*, size_t, int) = nullptr;
  int (*synchronize)() = nullptr;
  int (*create)(void**) = nullptr;
  int (*destroy)(void*) = nullptr;
  int (*sgemm)(void*, int, int, int, int, int, const float*, const float*, int, const float*, int,
               const float*, float*, int) = nullptr;
};

namespace {

// cudaMemcpyKind
constexpr int kHostToDevice = 1, kDeviceToHost = 2, kDeviceToDevice = 3;
constexpr int kNoTranspose = 0;  // CUBLAS_OP_N

void* open_first(const std::vector<const char*>& names) {
  for (const char* n : names)
    if (void* lib = dlopen(n, RTLD_NOW | RTLD_LOCAL)) return lib;
  std::string all;
  for (const char* n : names) all += std::string(all.empty() ? "" : ", ") + n;
  throw Error("bench: cannot open any of " + all + " (the CUDA toolkit's libraries)");
}

template <class F>
void bind(F& fn, void* lib, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  OPFORGE_CHECK(fn) << "bench: " << name << " is missing from the CUDA libraries";
}

void check(int status, const char* what) {
  OPFORGE_CHECK(status == 0) << "bench: " << what << " failed with status " << status;
}

}  // namespace

CuBlas::CuBlas() : api_(new Api) {
  void* rt = open_first({"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                         "/usr/local/cuda/lib64/libcudart.so"});
  void* blas = open_first({"libcublas.so", "libcublas.so.13", "libcublas.so.12", "libcublas.so.11",
                           "/usr/local/cuda/lib64/libcublas.so"});
  bind(api_->malloc, rt, "cudaMalloc");
  bind(api_->free, rt, "cudaFree");
  bind(api_->memcpy, rt, "cudaMemcpy");
  bind(api_->synchronize, rt, "cudaDeviceSynchronize");
  bind(api_->create, blas, "cublasCreate_v2");
  bind(api_->destroy, blas, "cublasDestroy_v2");
  bind(api_->sgemm, blas, "cublasSgemm_v2");
  check(api_->create(&handle_), "cublasCreate");
}

CuBlas::~CuBlas() {
  for (void* b : buffers_) api_->free(b);
  if (handle_) api_->destroy(handle_);
  delete api_;
}

float* CuBlas::alloc(size_t n) {
  void* p = nullptr;
  check(api_->malloc(&p, n * sizeof(float)), "cudaMalloc");
  buffers_.push_back(p);
  return static_cast<float*>(p);
}

float* CuBlas::upload(const std::vector<float>& host) {
  float* d = alloc(host.size());
  check(api_->memcpy(d, host.data(), host.size() * sizeof(float), kHostToDevice), "cudaMemcpy");
  return d;
}

std::vector<float> CuBlas::download(const float* device, size_t n) {
  std::vector<float> host(n);
  check(api_->memcpy(host.data(), device, n * sizeof(float), kDeviceToHost), "cudaMemcpy");
  return host;
}

void CuBlas::sgemm(int m, int n, int k, const float* a, const float* b, float* c) {
  // cuBLAS is column-major: row-major C = A B is column-major C^T = B^T A^T.
  const float one = 1, zero = 0;
  check(api_->sgemm(handle_, kNoTranspose, kNoTranspose, n, m, k, &one, b, n, a, k, &zero, c, n),
        "cublasSgemm");
}

void CuBlas::copy(const float* src, float* dst, size_t n) {
  check(api_->memcpy(dst, src, n * sizeof(float), kDeviceToDevice), "cudaMemcpy");
}

void CuBlas::sync() { check(api_->synchronize(), "cudaDeviceSynchronize"); }

}  // namespace opforge::cli
