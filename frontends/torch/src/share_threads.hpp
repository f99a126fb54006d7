// The threads that run DataParallel's shares beyond the first: kept from step to step, asleep in
// between. A thread made for each step starts behind whatever else runs on its core (a new
// thread's first time slice comes after theirs: up to 3 ms behind a process spinning on a loaded
// device's core, longer than an MLP's whole share), where a sleeping thread that is woken runs
// soon and costs no thread creation.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace opforge::torch::nn {

class ShareThreads {
 public:
  ShareThreads() = default;
  ~ShareThreads();
  ShareThreads(const ShareThreads&) = delete;
  ShareThreads& operator=(const ShareThreads&) = delete;
  // Runs job(i) for every i in [0, n): job(0) on the calling thread, each other on a thread of
  // its own; returns once all have returned. job must not throw. One run at a time.
  void run(size_t n, const std::function<void(size_t)>& job);

 private:
  void loop(size_t i, uint64_t seen);
  std::mutex run_mu_;  // one run at a time (copies of a DataParallel share the threads)
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;  // threads_[k] runs job(k + 1)
  const std::function<void(size_t)>* job_ = nullptr;
  size_t n_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace opforge::torch::nn
