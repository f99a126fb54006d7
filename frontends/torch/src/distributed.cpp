// torch::distributed over OpenMPI's C API, or, in a build without it, errors that say so.
#include "opforge/torch/distributed.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "opforge/autograd.hpp"
#include "opforge/error.hpp"

#ifdef OPFORGE_HAVE_MPI
// The C API only: OpenMPI's deprecated C++ bindings do not compile cleanly with -Werror.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace opforge::torch::distributed {

bool launched() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (const char* s = std::getenv(v); s && *s) return true;
  return false;
}

#ifndef OPFORGE_HAVE_MPI

bool available() { return false; }
namespace {
[[noreturn]] void missing() {
  throw Error(
      "this build of opforge has no MPI: install Debian's libopenmpi-dev and openmpi-bin "
      "(scripts/install-deps.sh does) and build again");
}
}  // namespace
void init() { missing(); }
int rank() { missing(); }
int world_size() { missing(); }
void barrier() { missing(); }
void broadcast(const std::vector<Tensor>&, int) { missing(); }
void all_reduce_mean(const std::vector<Tensor>&, size_t) { missing(); }
void check_same(uint64_t, const char*) { missing(); }
struct GradientReducer::Impl {};
void abort_job(int) {}
GradientReducer::GradientReducer(std::vector<Tensor>, size_t, size_t) { missing(); }
GradientReducer::~GradientReducer() = default;
void GradientReducer::finish() { missing(); }
size_t GradientReducer::buckets() const { missing(); }
size_t GradientReducer::started_during_backward() const { missing(); }

#else

bool available() { return true; }

namespace {
void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string("distributed: ") + what + " failed: " + std::string(text, size_t(len)));
}
bool started() {
  int on = 0;
  MPI_Initialized(&on);
  return on != 0;
}
void require_started(const char* what) {
  OPFORGE_CHECK(started()) << "distributed: " << what << " before init()";
}
MPI_Datatype type_of(const Tensor& t) {
  OPFORGE_CHECK(t.dtype() == DType::Float32 || t.dtype() == DType::Float64)
      << "distributed: float32 and float64 tensors are reduced, got " << dtype_name(t.dtype());
  return t.dtype() == DType::Float32 ? MPI_FLOAT : MPI_DOUBLE;
}
void check_host(const Tensor& t, const char* what) {
  OPFORGE_CHECK(t.defined() && t.is_contiguous() && t.device().kind == DeviceKind::cpu)
      << "distributed: " << what << " takes contiguous host tensors, got one of shape "
      << shape_str(t.shape()) << " on " << t.device().str();
}
}  // namespace

void init() {
  if (started()) return;
  int provided = 0;
  // One thread at a time talks to MPI (the one that runs backward(), where the reducer's hooks
  // start buckets).
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  OPFORGE_CHECK(provided >= MPI_THREAD_SERIALIZED)
      << "distributed: this MPI gives thread level " << provided
      << ", below MPI_THREAD_SERIALIZED (the backward pass's hooks start reductions)";
  // Errors come back as codes (raised as Errors here) rather than aborting every rank.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit([] {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
  });
}

int rank() {
  require_started("rank()");
  int r = 0;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &r), "MPI_Comm_rank");
  return r;
}

int world_size() {
  require_started("world_size()");
  int n = 1;
  check(MPI_Comm_size(MPI_COMM_WORLD, &n), "MPI_Comm_size");
  return n;
}

void barrier() {
  require_started("barrier()");
  check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

void broadcast(const std::vector<Tensor>& tensors, int root) {
  require_started("broadcast()");
  for (const Tensor& t : tensors) {
    check_host(t, "broadcast");
    // data() waits for pending writes and marks the tensor written (GPU copies become stale).
    void* p = t.data();
    check(MPI_Bcast(p, int(t.numel()), type_of(t), root, MPI_COMM_WORLD), "MPI_Bcast");
  }
}

void all_reduce_mean(const std::vector<Tensor>& tensors, size_t bucket_bytes) {
  require_started("all_reduce_mean()");
  OPFORGE_CHECK(bucket_bytes > 0) << "distributed: a bucket of 0 bytes";
  const int world = world_size();
  struct Bucket {
    std::vector<Tensor> members;
    std::vector<char> data;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::vector<Bucket> buckets;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    check_host(t, "all_reduce_mean");
    type_of(t);
    const size_t bytes = size_t(t.numel()) * t.element_size();
    bool fits = !buckets.empty() && buckets.back().members[0].dtype() == t.dtype() &&
                buckets.back().data.size() + bytes <= bucket_bytes;
    if (!fits) buckets.emplace_back();
    Bucket& b = buckets.back();
    const size_t at = b.data.size();
    b.data.resize(at + bytes);
    std::memcpy(b.data.data() + at, t.const_data(), bytes);
    b.members.push_back(t);
  }
  // Every bucket in flight at once; MPI progresses them together. Should one fail to start,
  // those started are waited for before their buffers go.
  try {
    for (Bucket& b : buckets) {
      const Tensor& first = b.members[0];
      const int count = int(b.data.size() / first.element_size());
      check(MPI_Iallreduce(MPI_IN_PLACE, b.data.data(), count, type_of(first), MPI_SUM,
                           MPI_COMM_WORLD, &b.request),
            "MPI_Iallreduce");
    }
  } catch (...) {
    for (Bucket& b : buckets) MPI_Wait(&b.request, MPI_STATUS_IGNORE);
    throw;
  }
  for (Bucket& b : buckets) {
    check(MPI_Wait(&b.request, MPI_STATUS_IGNORE), "MPI_Wait");
    size_t at = 0;
    for (const Tensor& t : b.members) {
      const size_t bytes = size_t(t.numel()) * t.element_size();
      void* dst = t.data();
      std::memcpy(dst, b.data.data() + at, bytes);
      at += bytes;
      autograd::NoGradGuard no_grad;
      Tensor(t).mul_(1.0 / double(world));
    }
  }
}

struct GradientReducer::Impl {
  struct Bucket {
    std::vector<size_t> members;  // parameter indices
    std::vector<char> data;
    MPI_Request request = MPI_REQUEST_NULL;
    size_t ready = 0;
    bool started = false;
  };
  std::vector<Tensor> params;
  std::vector<uint64_t> hooks;
  std::vector<size_t> bucket_of;
  std::vector<Bucket> buckets;
  std::vector<char> seen;   // this pass: the parameter's gradient was accumulated
  std::vector<char> stale;  // by bucket: started, then a gradient in it accumulated again
  size_t early = 0, early_last = 0;
  std::mutex mu;  // hooks may come from several threads' backward passes

  void on_gradient(size_t k) {
    std::lock_guard<std::mutex> lock(mu);
    const size_t bi = bucket_of[k];
    Bucket& b = buckets[bi];
    if (seen[k]) {  // a second backward() before finish(): the bucket is reduced again there
      if (b.started) stale[bi] = 1;
      return;
    }
    seen[k] = 1;
    if (!b.started && ++b.ready == b.members.size()) {
      start(b);
      early++;
    }
    progress();
  }

  void start(Bucket& b) {
    size_t at = 0;
    for (size_t j : b.members) {
      const Tensor& p = params[j];
      const size_t bytes = size_t(p.numel()) * p.element_size();
      Tensor g = p.grad();
      if (g.defined()) {
        check_host(g, "GradientReducer");
        std::memcpy(b.data.data() + at, g.contiguous().const_data(), bytes);
      } else {
        std::memset(b.data.data() + at, 0, bytes);
      }
      at += bytes;
    }
    const Tensor& first = params[b.members[0]];
    check(MPI_Iallreduce(MPI_IN_PLACE, b.data.data(), int(b.data.size() / first.element_size()),
                         type_of(first), MPI_SUM, MPI_COMM_WORLD, &b.request),
          "MPI_Iallreduce");
    b.started = true;
  }
  // MPI moves a non-blocking collective on only inside MPI calls (OpenMPI runs no progress
  // thread by default): a test of the buckets in flight at each gradient lets them advance while
  // the backward pass goes on.
  void progress() {
    for (Bucket& b : buckets)
      if (b.started && b.request != MPI_REQUEST_NULL) {
        int done = 0;
        check(MPI_Test(&b.request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      }
  }
};

GradientReducer::GradientReducer(std::vector<Tensor> params, size_t bucket_bytes,
                                 size_t first_bucket_bytes)
    : impl_(std::make_unique<Impl>()) {
  require_started("GradientReducer");
  OPFORGE_CHECK(bucket_bytes > 0) << "GradientReducer: a bucket of 0 bytes";
  Impl& m = *impl_;
  for (const Tensor& p : params)
    if (p.requires_grad()) m.params.push_back(p);
  m.bucket_of.resize(m.params.size());
  m.seen.assign(m.params.size(), 0);
  for (size_t k = m.params.size(); k-- > 0;) {  // the last parameters first
    const Tensor& p = m.params[k];
    type_of(p);
    const size_t bytes = size_t(p.numel()) * p.element_size();
    const size_t cap =
        m.buckets.size() == 1 ? std::min(first_bucket_bytes, bucket_bytes) : bucket_bytes;
    bool fits = !m.buckets.empty() && m.params[m.buckets.back().members[0]].dtype() == p.dtype() &&
                m.buckets.back().data.size() + bytes <= cap;
    if (!fits) m.buckets.emplace_back();
    m.buckets.back().members.push_back(k);
    m.buckets.back().data.resize(m.buckets.back().data.size() + bytes);
    m.bucket_of[k] = m.buckets.size() - 1;
  }
  m.stale.assign(m.buckets.size(), 0);
  for (size_t k = 0; k < m.params.size(); k++)
    m.hooks.push_back(autograd::register_post_accumulate_grad_hook(
        m.params[k], [impl = impl_.get(), k](const Tensor&) { impl->on_gradient(k); }));
}

GradientReducer::~GradientReducer() {
  if (!impl_) return;
  for (size_t k = 0; k < impl_->hooks.size(); k++)
    autograd::remove_post_accumulate_grad_hook(impl_->params[k], impl_->hooks[k]);
  for (Impl::Bucket& b : impl_->buckets)  // an exception left some in flight
    if (b.started) MPI_Wait(&b.request, MPI_STATUS_IGNORE);
}

void GradientReducer::finish() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  for (Impl::Bucket& b : m.buckets)
    if (!b.started) m.start(b);
  const double scale = 1.0 / double(world_size());
  autograd::NoGradGuard no_grad;
  for (size_t bi = 0; bi < m.buckets.size(); bi++) {
    Impl::Bucket& b = m.buckets[bi];
    check(MPI_Wait(&b.request, MPI_STATUS_IGNORE), "MPI_Wait");
    if (m.stale[bi]) {  // what it reduced is not the gradients now: again, with them
      m.start(b);
      check(MPI_Wait(&b.request, MPI_STATUS_IGNORE), "MPI_Wait");
      m.stale[bi] = 0;
    }
    b.started = false;
    b.ready = 0;
    size_t at = 0;
    for (size_t j : b.members) {
      Tensor p = m.params[j];
      Tensor g = p.grad();
      if (!g.defined() || !g.is_contiguous()) {
        g = Tensor::empty(p.shape(), p.dtype());
        p.set_grad(g);
      }
      const size_t bytes = size_t(g.numel()) * g.element_size();
      std::memcpy(g.data(), b.data.data() + at, bytes);
      at += bytes;
      g.mul_(scale);
    }
  }
  m.early_last = m.early;
  m.early = 0;
  std::fill(m.seen.begin(), m.seen.end(), 0);
}

size_t GradientReducer::buckets() const { return impl_->buckets.size(); }
size_t GradientReducer::started_during_backward() const { return impl_->early_last; }

void abort_job(int code) {
  int on = 0, done = 0;
  MPI_Initialized(&on);
  MPI_Finalized(&done);
  if (!on || done) return;
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

void check_same(uint64_t fingerprint, const char* what) {
  const int n = world_size();
  std::vector<unsigned long long> all(size_t(n), 0);
  unsigned long long mine = fingerprint;
  check(MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG,
                      MPI_COMM_WORLD),
        "MPI_Allgather");
  for (int r = 1; r < n; r++)
    OPFORGE_CHECK(all[size_t(r)] == all[0])
        << "distributed: rank " << r << "'s " << what << " differs from rank 0's (every rank must "
        << "run the same model on data of the same shapes)";
}

#endif

}  // namespace opforge::torch::distributed
