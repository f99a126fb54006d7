// Thread pools of the logical CPU devices and the halide_do_par_for that routes to them.
#include "devices/cpu/cpu_pool.hpp"

#include <HalideRuntime.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include "devices/backend.hpp"
#include "opforge/error.hpp"

namespace opforge::detail {

namespace {
// The pool whose worker this thread is, if any.
thread_local const CpuPool* current_pool = nullptr;
}  // namespace

struct CpuPool::Job {
  void* ctx;
  int (*f)(void*, int, uint8_t*);
  uint8_t* closure;
  int min, size;
  std::atomic<int> next{0}, finished{0}, result{0};
  int active = 0;   // workers holding this job; guarded by the pool's mutex
  int helpers = 0;  // workers that may still take it up; guarded by the pool's mutex
};

CpuPool::CpuPool(std::vector<int> cores) : cores_(std::move(cores)) {
  for (size_t i = 0; i < cores_.size(); i++) {
    threads_.emplace_back([this] { worker(); });
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cores_) CPU_SET(c, &set);
    pthread_setaffinity_np(threads_.back().native_handle(), sizeof(set), &set);
  }
}

CpuPool::~CpuPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

std::vector<int> CpuPool::thread_ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tids_;
}

void CpuPool::run_tasks(Job& job) {
  auto t0 = std::chrono::steady_clock::now();
  int done = 0;
  for (int i; (i = job.next.fetch_add(1)) < job.size; done++) {
    int cpu = sched_getcpu();
    bool mine = false;
    for (int c : cores_) mine |= c == cpu;
    if (!mine) foreign_++;
    int r = job.f(job.ctx, job.min + i, job.closure);
    if (r != 0) job.result.store(r);
  }
  tasks_ += done;
  busy_ns_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  job.finished.fetch_add(done);
}

void CpuPool::worker() {
  current_pool = this;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tids_.push_back(int(syscall(SYS_gettid)));
  }
  uint64_t seen = 0;
  for (;;) {
    Job* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || (job_ && job_serial_ != seen && job_->helpers > 0); });
      if (stop_) return;
      job = job_;
      seen = job_serial_;
      job->helpers--;
      job->active++;
    }
    run_tasks(*job);
    {
      // The job lives on the caller's stack: it may return only once no worker holds it.
      std::lock_guard<std::mutex> lock(mu_);
      job->active--;
    }
    done_.notify_all();
  }
}

bool CpuPool::caller_on_cores() const {
  // Cached per thread: a thread's affinity is set once, when it is made (the device queues').
  thread_local const CpuPool* checked = nullptr;
  thread_local bool inside = false;
  if (checked == this) return inside;
  cpu_set_t set;
  CPU_ZERO(&set);
  inside = pthread_getaffinity_np(pthread_self(), sizeof(set), &set) == 0;
  for (int c = 0; inside && c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set)) inside = std::find(cores_.begin(), cores_.end(), c) != cores_.end();
  checked = this;
  return inside;
}

int CpuPool::parallel_for(void* ctx, int (*f)(void*, int, uint8_t*), int min, int size,
                          uint8_t* closure) {
  if (size <= 0) return 0;
  if (current_pool == this) {
    // A parallel loop nested in one of this pool's tasks: its threads are busy with the outer
    // loop, so run the inner one here.
    int result = 0;
    for (int i = 0; i < size; i++)
      if (int r = f(ctx, min + i, closure)) result = r;
    return result;
  }
  std::lock_guard<std::mutex> run(run_mu_);
  Job job;
  job.ctx = ctx;
  job.f = f;
  job.closure = closure;
  job.min = min;
  job.size = size;
  // A caller pinned to the device's cores (its queue's thread) runs tasks too, and wakes one
  // worker fewer: on a one-core device no worker at all. Each hand-off is a wake-up, and on a core
  // another process keeps busy a woken thread can wait out that process's time slice.
  const bool join = caller_on_cores();
  const int threads = int(threads_.size()) - (join ? 1 : 0);
  const int helpers = std::max(0, std::min(threads, join ? size - 1 : size));
  job.helpers = helpers;
  if (helpers > 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      job_serial_++;
    }
    if (helpers == int(threads_.size()))
      wake_.notify_all();
    else
      for (int k = 0; k < helpers; k++) wake_.notify_one();
  }
  if (join) {
    const CpuPool* before = current_pool;
    current_pool = this;
    run_tasks(job);
    current_pool = before;
  }
  if (helpers == 0) return job.result.load();  // the caller ran every task
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return job.finished.load() == size && job.active == 0; });
  job_ = nullptr;
  return job.result.load();
}

std::vector<std::vector<int>> parse_cpu_devices(const std::string& spec) {
  std::vector<std::vector<int>> out;
  int ncpu = int(std::thread::hardware_concurrency());
  std::vector<bool> taken(static_cast<size_t>(ncpu));
  std::stringstream devices(spec);
  for (std::string dev; std::getline(devices, dev, ';');) {
    std::vector<int> cores;
    std::stringstream parts(dev);
    for (std::string part; std::getline(parts, part, ',');) {
      int lo, hi;
      char dash;
      std::stringstream ps(part);
      bool ok = bool(ps >> lo);
      if (ok && ps >> dash)
        ok = dash == '-' && bool(ps >> hi) && ps.eof();
      else
        hi = lo;
      OPFORGE_CHECK(ok && lo >= 0 && hi >= lo && hi < ncpu)
          << "OPFORGE_CPU_DEVICES: '" << part << "' in '" << spec
          << "' is not a core or range of cores 0-" << ncpu - 1
          << " (expected for example \"0;1\" or \"0-7;8-15\")";
      for (int c = lo; c <= hi; c++) {
        // Devices split the cores: two sharing one would each measure the other's work as load.
        OPFORGE_CHECK(!taken[size_t(c)])
            << "OPFORGE_CPU_DEVICES: core " << c << " is given twice in '" << spec
            << "' (each core belongs to one device, as in \"0;1\" or \"0-7;8-15\")";
        taken[size_t(c)] = true;
        cores.push_back(c);
      }
    }
    OPFORGE_CHECK(!cores.empty()) << "OPFORGE_CPU_DEVICES: device " << out.size() << " of '" << spec
                                  << "' has no cores";
    out.push_back(cores);
  }
  return out;
}

namespace {
// Parallel loops of kernels called with a logical device's pool as user context run there; the
// others (context null) use Halide's default pool.
int do_par_for(void* ctx, halide_task_t f, int min, int size, uint8_t* closure) {
  auto* u = static_cast<UserContext*>(ctx);
  if (!u || !u->pool) return halide_default_do_par_for(ctx, f, min, size, closure);
  return u->pool->parallel_for(ctx, f, min, size, closure);
}
}  // namespace

const std::vector<std::unique_ptr<CpuPool>>& cpu_pools() {
  static const std::vector<std::unique_ptr<CpuPool>>* pools = [] {
    auto* p = new std::vector<std::unique_ptr<CpuPool>>;
    if (const char* spec = std::getenv("OPFORGE_CPU_DEVICES"); spec && *spec) {
      for (auto& cores : parse_cpu_devices(spec)) p->push_back(std::make_unique<CpuPool>(cores));
      halide_set_custom_do_par_for(do_par_for);
    }
    return p;
  }();
  return *pools;
}

}  // namespace opforge::detail
