// Asynchronous execution per device: each device that runs work off the caller's thread has one
// FIFO queue with one worker. A call's completion is an Event; the storages a call reads and writes
// remember the events of the calls that use them, so a later call (on any device) or a host read
// waits for exactly what it depends on.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace opforge::detail {

class Event {
 public:
  // expected_end: when the work is predicted to finish, on the dispatcher's clock.
  Event(int queue, double expected_end) : queue_(queue), expected_end_(expected_end) {}
  // Marks the work done; a non-empty error marks it failed.
  void complete(std::string error = {});
  // Blocks until done; returns the error message, empty on success.
  const std::string& wait() const;
  bool done() const;
  int queue() const { return queue_; }
  double expected_end() const { return expected_end_; }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
  int queue_;
  double expected_end_;
};
using EventPtr = std::shared_ptr<Event>;

// An event a call must wait for; carries_error: its failure fails the call too (the call reads
// what it wrote). Ordering-only waits (a reader before a write, an overwritten result) do not.
struct Dependency {
  EventPtr event;
  bool carries_error = false;
};

class DeviceQueue {
 public:
  // The worker is pinned to `cores` (all cores when empty). About `capacity` calls wait in the
  // queue (wait_for_space() holds producers back there), so a producer cannot run far ahead.
  DeviceQueue(int id, std::vector<int> cores, size_t capacity = 64);
  ~DeviceQueue();
  // Blocks while the queue is full. Call it before taking any lock other callers need: submit()
  // itself never blocks, so a caller waiting here holds up no one else.
  void wait_for_space();
  void submit(std::function<void()> task);
  void drain();  // returns when every submitted call has run
  int id() const { return id_; }
  int thread_id() const { return tid_; }  // the worker's kernel thread id (for its CPU accounting)

 private:
  void worker();
  int id_;
  size_t capacity_;
  std::mutex mu_;
  std::condition_variable ready_, space_, idle_;
  std::deque<std::function<void()>> tasks_;
  bool running_ = false, stop_ = false;
  int tid_ = 0;
  std::thread thread_;
};

}  // namespace opforge::detail
