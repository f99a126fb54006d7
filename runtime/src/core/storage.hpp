// The memory behind tensors. Host memory comes in 64-byte aligned blocks from a caching allocator,
// so a loop that allocates same-sized outputs reuses memory whose pages are already mapped (a fresh
// 64 MB block costs more in page faults than an elementwise kernel over it). A storage also keeps
// copies on GPU devices, each valid or stale (the MSI idea): a tensor that lives on the host may be
// cached on a GPU, one that lives on a GPU gets host memory only when the host reads it, and a call
// copies only what is stale where it runs.
#pragma once
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "dispatch/device_queue.hpp"
#include "opforge/device.hpp"

namespace opforge {

namespace detail {
class DeviceMemory;
struct DeviceBlock;
// The block size an allocation of `bytes` gets: powers of two up to 1 MiB, then whole MiB.
size_t size_class(size_t bytes);
}  // namespace detail

// Shared by tensor handles; a queued call takes its own reference (shared_from_this) so that its
// buffers outlive the caller's handles.
struct Storage : std::enable_shared_from_this<Storage> {
  // Host memory; null for a GPU tensor the host has not read (set by a worker, read by launch()).
  std::atomic<void*> ptr{nullptr};
  size_t bytes = 0;     // requested
  size_t capacity = 0;  // of the host block, a size class
  int charged_to = -1;  // the capped CPU device its host block counts against (host_caps.hpp)
  // In-place writes so far (autograd's version counter: a saved tensor written since is stale).
  std::atomic<uint32_t> version{0};
  // User-provided, so that make_shared does not zero the whole object before constructing it
  // (every member has its initialiser): one allocation per call's result.
  Storage() {}
  ~Storage();
  static std::shared_ptr<Storage> allocate(size_t bytes);

  // ---- where the data is (callers have waited for the calls it depends on) ----
  // Where the tensor lives: a CPU device (host memory) or a GPU device.
  Device home() const;
  // A new output of a call that runs on GPU device `d` lives there: gives back its host block.
  // Only a storage no call has used and nothing has written moves; returns whether it did.
  bool adopt_home(const Device& d);
  // Any GPU copy was ever made: until then the host copy is the only one and nothing below is
  // needed (the common, CPU-only case costs one atomic load).
  bool on_gpus() const { return on_gpus_.load(std::memory_order_acquire); }
  // Makes the host copy current, allocating it, and returns it.
  void* host_current();
  // The host copy was (or is about to be) overwritten: every GPU copy is stale.
  void host_written();
  // Makes the copy on `mem` current and returns it; `overwrite`: the caller writes all of it, so
  // nothing needs copying there first. `pin`: a call will use the block; unpin() when it is done.
  detail::DeviceBlock& device_current(detail::DeviceMemory& mem, bool overwrite, bool pin = false);
  void unpin(detail::DeviceMemory& mem);
  // Under memory pressure on `mem`: gives its copy there back to the allocator if nothing is lost
  // (stale, or valid elsewhere too, or a host tensor's copy, which is first copied to the host) and
  // no call uses it. Never waits: 0 if the storage is busy. Returns the bytes given back.
  size_t evict(detail::DeviceMemory& mem);
  // A call on `mem` wrote its copy: every other copy is stale.
  void device_written(detail::DeviceMemory& mem);
  // A call on `mem` that may have written part of its copy failed: that copy is stale.
  void device_failed(detail::DeviceMemory& mem);
  // Bytes a call on `mem` (null: the host) must copy before it can read this storage.
  size_t stale_bytes(const detail::DeviceMemory* mem) const;

  // ---- ordering of asynchronous work (device_queue.hpp) ----
  // Adds to `deps` the events a call must wait for before it reads and/or writes this memory: the
  // last writer (whose failure a read inherits), and for a write also the readers since.
  void dependencies(std::vector<detail::Dependency>& deps, bool read, bool write) const {
    if (tracked_.load(std::memory_order_acquire)) add_dependencies(deps, read, write);
  }
  // Records a submitted call's event as the last writer or as one more reader.
  void record(const detail::EventPtr& ev, bool write);
  // A call on the caller's thread has overwritten this memory: earlier events no longer matter.
  void written_in_place() {
    written_.store(true, std::memory_order_release);
    if (tracked_.load(std::memory_order_acquire)) forget_events();
  }
  // Waits for every pending call that uses this memory (before the host reads or writes it);
  // throws the Error of the call that last wrote it, if that failed.
  void sync() const;

 private:
  mutable std::mutex mu_;
  std::atomic<bool> tracked_{false};  // any event recorded yet: until then nothing to lock
  detail::EventPtr writer_;
  std::vector<detail::EventPtr> readers_;

  struct Copy {
    detail::DeviceMemory* mem;
    detail::DeviceBlock* block;
    bool valid;
    int pins;  // calls preparing or running with this copy: it must stay
  };
  Copy* copy_on(const detail::DeviceMemory* mem);
  // The parts of dependencies() and written_in_place() once an event was recorded (out of line:
  // the common untracked case is a load on the per-call path).
  void add_dependencies(std::vector<detail::Dependency>& deps, bool read, bool write) const;
  void forget_events();
  void* host_block();
  mutable std::mutex data_mu_;  // guards what follows
  Device home_;
  bool host_valid_ = true;
  std::vector<Copy> copies_;
  std::atomic<bool> on_gpus_{false};
  std::atomic<bool> written_{false};  // by anything: a storage once written stays where it lives
};

// Returns every cached block to the system.
void release_cached_memory();
// Bytes held in the cache (not in use by any tensor).
size_t cached_memory_bytes();

}  // namespace opforge
