// cuBLAS and the CUDA runtime, the peers of opforge's CUDA kernels in `opforge bench`. They are
// opened with dlopen when a CUDA benchmark runs, so the command line links nothing of CUDA and runs
// on machines without it; the CUDA benchmarks exist only where cuda:0 does.
#pragma once
#include <cstddef>
#include <vector>

namespace opforge::cli {

class CuBlas {
 public:
  // Opens the libraries and a cuBLAS handle; throws an Error naming what is missing or failed.
  CuBlas();
  ~CuBlas();
  CuBlas(const CuBlas&) = delete;
  CuBlas& operator=(const CuBlas&) = delete;

  // Device buffers of n floats, freed with the object.
  float* alloc(size_t n);
  float* upload(const std::vector<float>& host);
  std::vector<float> download(const float* device, size_t n);
  // Row-major C[m x n] = A[m x k] B[k x n] on the device.
  void sgemm(int m, int n, int k, const float* a, const float* b, float* c);
  void copy(const float* src, float* dst, size_t n);  // device to device
  void sync();

 private:
  struct Api;
  Api* api_;
  void* handle_ = nullptr;
  std::vector<void*> buffers_;
};

}  // namespace opforge::cli
