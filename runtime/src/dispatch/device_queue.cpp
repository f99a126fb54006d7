// Device work queues and completion events.
#include "dispatch/device_queue.hpp"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <future>

namespace opforge::detail {

void Event::complete(std::string error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

const std::string& Event::wait() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return error_;
}

bool Event::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

DeviceQueue::DeviceQueue(int id, std::vector<int> cores, size_t capacity)
    : id_(id), capacity_(capacity) {
  // The worker reports its kernel thread id through a future the constructor owns until it is set.
  std::promise<int> tid;
  std::future<int> got = tid.get_future();
  thread_ = std::thread([this, tid = std::move(tid)]() mutable {
    tid.set_value(int(syscall(SYS_gettid)));
    worker();
  });
  tid_ = got.get();
  if (!cores.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cores) CPU_SET(c, &set);
    pthread_setaffinity_np(thread_.native_handle(), sizeof(set), &set);
  }
}

DeviceQueue::~DeviceQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  ready_.notify_all();
  thread_.join();
}

void DeviceQueue::wait_for_space() {
  std::unique_lock<std::mutex> lock(mu_);
  space_.wait(lock, [&] { return tasks_.size() < capacity_; });
}

void DeviceQueue::submit(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.push_back(std::move(task));
  ready_.notify_one();
}

void DeviceQueue::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return tasks_.empty() && !running_; });
}

void DeviceQueue::worker() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
    }
    space_.notify_one();
    // Tasks report their own errors through their events; this is the last line of defence, so
    // that a fault in one never takes the process down.
    try {
      task();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "opforge: a task on device queue %d failed: %s\n", id_, e.what());
    } catch (...) {
      std::fprintf(stderr, "opforge: a task on device queue %d failed\n", id_);
    }
    task = nullptr;  // what it holds (tensors, device blocks) goes before drain() returns
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
    }
    idle_.notify_all();
  }
}

}  // namespace opforge::detail
