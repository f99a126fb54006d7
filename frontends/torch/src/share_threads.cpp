// ShareThreads: DataParallel's persistent share threads.
#include "share_threads.hpp"

namespace opforge::torch::nn {

ShareThreads::~ShareThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ShareThreads::loop(size_t i, uint64_t seen) {
  for (;;) {
    const std::function<void(size_t)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (i >= n_) continue;  // fewer shares this run than threads
      job = job_;
    }
    (*job)(i);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
    }
    done_.notify_all();
  }
}

void ShareThreads::run(size_t n, const std::function<void(size_t)>& job) {
  std::lock_guard<std::mutex> one_run(run_mu_);
  while (threads_.size() + 1 < n) {
    const size_t i = threads_.size() + 1;
    uint64_t now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      now = generation_;
    }
    // A new thread waits for the next run, not one that ended; it throws (nothing started) if it
    // cannot be made.
    threads_.emplace_back([this, i, now] { loop(i, now); });
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    n_ = n;
    pending_ = n > 0 ? n - 1 : 0;
    generation_++;
  }
  wake_.notify_all();
  if (n > 0) job(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

}  // namespace opforge::torch::nn
