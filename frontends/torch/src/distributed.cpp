// torch::distributed over OpenMPI's C API, or, in a build without it, errors that say so.
#include "opforge/torch/distributed.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
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
void all_reduce_sum(const std::vector<Tensor>&, size_t) { missing(); }
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

size_t bytes_of(const Tensor& t) { return size_t(t.numel()) * t.element_size(); }

// OpenMPI's non-blocking all-reduce (coll/libnbc) reduces to rank 0 and broadcasts back whenever
// the buffer is in place or there are fewer than four ranks: every byte crosses twice, one rank at
// a time (0.6 ms for the MLP's 2.1 MB on two ranks of this project's 2-core machine, against
// 0.25-0.3 for a reduce-scatter and all-gather). Unless the user chose an algorithm (`--mca
// coll_libnbc_iallreduce_algorithm`, an environment variable or a parameter file: the variable is
// then no longer 0), a bucket of at least one element per rank gets Rabenseifner's (libnbc's 3):
// reduce-scatter then all-gather, bandwidth-optimal in about 2 log2(p) rounds; smaller ones keep
// libnbc's choice (below that, libnbc would take a ring of 2(p-1) rounds). The choice goes through
// MPI's tool interface, which libnbc reads at each call; another MPI has no such variable, and
// nothing is changed.
class NbcAllreduceAlgorithm {
 public:
  void setup() {
    int provided = 0, index = 0, count = 0, now = 0;
    if (MPI_T_init_thread(MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) return;
    t_started_ = true;
    if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) != MPI_SUCCESS ||
        MPI_T_cvar_handle_alloc(index, nullptr, &handle_, &count) != MPI_SUCCESS)
      return;
    usable_ = count == 1 && MPI_T_cvar_read(handle_, &now) == MPI_SUCCESS && now == 0;
  }
  void before(size_t count, int ranks) {
    if (!usable_) return;
    int want = count >= size_t(ranks) ? kRabenseifner : 0;
    if (want != current_ && MPI_T_cvar_write(handle_, &want) == MPI_SUCCESS) current_ = want;
  }
  void finish() {
    if (t_started_) MPI_T_finalize();
    t_started_ = usable_ = false;
  }

 private:
  static constexpr int kRabenseifner = 3;
  MPI_T_cvar_handle handle_ = nullptr;
  bool t_started_ = false, usable_ = false;
  int current_ = 0;
};
NbcAllreduceAlgorithm nbc_allreduce;

// Tensors packed into buckets, each summed over the ranks by one MPI_Iallreduce: all_reduce_mean's
// and GradientReducer's. A bucket holds tensors of one dtype, its members by their index in the
// list it was made from.
struct Bucket {
  std::vector<size_t> members;
  std::vector<char> data;
  MPI_Datatype type = MPI_FLOAT;
  size_t element = 4;  // bytes
  MPI_Request request = MPI_REQUEST_NULL;
};

// The tensors like[k] for k in `order`, in buckets of at most `cap` bytes (the first at most
// `first_cap`); a tensor larger than that is a bucket alone.
std::vector<Bucket> make_buckets(const std::vector<Tensor>& like, const std::vector<size_t>& order,
                                 size_t cap, size_t first_cap) {
  OPFORGE_CHECK(cap > 0 && first_cap > 0) << "distributed: a bucket of 0 bytes";
  std::vector<Bucket> buckets;
  for (size_t k : order) {
    const MPI_Datatype type = type_of(like[k]);
    const size_t bytes = bytes_of(like[k]);
    const size_t limit = buckets.size() == 1 ? std::min(first_cap, cap) : cap;
    if (buckets.empty() || buckets.back().type != type ||
        buckets.back().data.size() + bytes > limit)
      buckets.push_back({{}, {}, type, like[k].element_size(), MPI_REQUEST_NULL});
    buckets.back().members.push_back(k);
    buckets.back().data.resize(buckets.back().data.size() + bytes);
  }
  return buckets;
}

// Packs value(k) of each member (zeros where it is undefined; `like` gives the sizes) and starts
// the bucket's reduction.
template <class Value>
void start(Bucket& b, const std::vector<Tensor>& like, Value value) {
  size_t at = 0;
  for (size_t k : b.members) {
    const size_t bytes = bytes_of(like[k]);
    if (Tensor v = value(k); v.defined()) {
      check_host(v, "the reduction");
      std::memcpy(b.data.data() + at, v.const_data(), bytes);
    } else {
      std::memset(b.data.data() + at, 0, bytes);
    }
    at += bytes;
  }
  const size_t count = b.data.size() / b.element;
  OPFORGE_CHECK(count <= size_t(std::numeric_limits<int>::max()))
      << "distributed: a bucket of " << count << " elements, more than MPI's int count allows";
  nbc_allreduce.before(count, world_size());
  check(MPI_Iallreduce(MPI_IN_PLACE, b.data.data(), int(count), b.type, MPI_SUM, MPI_COMM_WORLD,
                       &b.request),
        "MPI_Iallreduce");
}

// dest[i] = src[i] * scale: the copy out of the bucket and the mean in one pass.
template <class T>
void copy_scaled(T* dest, const char* src, size_t n, double scale) {
  const T s = T(scale);
  for (size_t i = 0; i < n; i++) {
    T v;
    std::memcpy(&v, src + i * sizeof(T), sizeof(T));  // the bucket holds bytes, not T objects
    dest[i] = v * s;
  }
}

// Waits for the bucket and writes each member's mean into dest(k), a contiguous host tensor.
template <class Dest>
void land(Bucket& b, const std::vector<Tensor>& like, Dest dest, double scale) {
  check(MPI_Wait(&b.request, MPI_STATUS_IGNORE), "MPI_Wait");
  size_t at = 0;
  for (size_t k : b.members) {
    Tensor d = dest(k);
    const size_t bytes = bytes_of(like[k]);
    if (b.type == MPI_FLOAT)
      copy_scaled(static_cast<float*>(d.data()), b.data.data() + at, bytes / 4, scale);
    else
      copy_scaled(static_cast<double*>(d.data()), b.data.data() + at, bytes / 8, scale);
    at += bytes;
  }
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
  nbc_allreduce.setup();
  std::atexit([] {
    nbc_allreduce.finish();
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

namespace {
// Each tensor replaced by its sum or mean over the ranks, in buckets all in flight at once.
void all_reduce_in_buckets(const std::vector<Tensor>& tensors, size_t bucket_bytes, bool mean,
                           const char* what) {
  require_started(what);
  const double scale = mean ? 1.0 / double(world_size()) : 1.0;
  std::vector<size_t> order;
  for (size_t k = 0; k < tensors.size(); k++)
    if (tensors[k].defined()) {
      check_host(tensors[k], what);
      order.push_back(k);
    }
  std::vector<Bucket> buckets = make_buckets(tensors, order, bucket_bytes, bucket_bytes);
  auto same = [&](size_t k) { return tensors[k]; };
  // Every bucket in flight at once; MPI progresses them together. Should one fail to start,
  // those started are waited for before their buffers go.
  try {
    for (Bucket& b : buckets) start(b, tensors, same);
  } catch (...) {
    for (Bucket& b : buckets) MPI_Wait(&b.request, MPI_STATUS_IGNORE);
    throw;
  }
  for (Bucket& b : buckets) land(b, tensors, same, scale);
}
}  // namespace

void all_reduce_mean(const std::vector<Tensor>& tensors, size_t bucket_bytes) {
  all_reduce_in_buckets(tensors, bucket_bytes, true, "all_reduce_mean()");
}

void all_reduce_sum(const std::vector<Tensor>& tensors, size_t bucket_bytes) {
  all_reduce_in_buckets(tensors, bucket_bytes, false, "all_reduce_sum()");
}

struct GradientReducer::Impl {
  std::vector<Tensor> params;
  std::vector<uint64_t> hooks;
  std::vector<size_t> bucket_of;
  std::vector<Bucket> buckets;
  std::vector<size_t> ready;  // by bucket: its gradients accumulated this pass
  std::vector<char> started;  // by bucket
  std::vector<char> stale;    // by bucket: started, then a gradient in it accumulated again
  std::vector<char> seen;     // by parameter: its gradient was accumulated this pass
  size_t early = 0, early_last = 0;
  std::mutex mu;  // hooks may come from several threads' backward passes

  void start_bucket(size_t bi) {
    start(buckets[bi], params, [&](size_t k) {
      Tensor g = params[k].grad();
      return g.defined() ? g.contiguous() : g;
    });
    started[bi] = 1;
  }
  void on_gradient(size_t k) {
    std::lock_guard<std::mutex> lock(mu);
    const size_t bi = bucket_of[k];
    if (seen[k]) {  // a second backward() before finish(): the bucket is reduced again there
      if (started[bi]) stale[bi] = 1;
      return;
    }
    seen[k] = 1;
    if (!started[bi] && ++ready[bi] == buckets[bi].members.size()) {
      start_bucket(bi);
      early++;
    }
    // MPI moves a non-blocking collective on only inside MPI calls (OpenMPI runs no progress
    // thread by default): a test of the buckets in flight at each gradient lets them advance
    // while the backward pass goes on.
    for (Bucket& b : buckets)
      if (b.request != MPI_REQUEST_NULL) {
        int done = 0;
        check(MPI_Test(&b.request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      }
  }
};

GradientReducer::GradientReducer(std::vector<Tensor> params, size_t bucket_bytes,
                                 size_t first_bucket_bytes)
    : impl_(std::make_unique<Impl>()) {
  require_started("GradientReducer");
  Impl& m = *impl_;
  for (const Tensor& p : params)
    if (p.requires_grad()) m.params.push_back(p);
  std::vector<size_t> last_first(m.params.size());  // their gradients come first in backward
  for (size_t k = 0; k < last_first.size(); k++) last_first[k] = last_first.size() - 1 - k;
  m.buckets = make_buckets(m.params, last_first, bucket_bytes, first_bucket_bytes);
  m.bucket_of.resize(m.params.size());
  for (size_t bi = 0; bi < m.buckets.size(); bi++)
    for (size_t k : m.buckets[bi].members) m.bucket_of[k] = bi;
  m.ready.assign(m.buckets.size(), 0);
  m.started.assign(m.buckets.size(), 0);
  m.stale.assign(m.buckets.size(), 0);
  m.seen.assign(m.params.size(), 0);
  for (size_t k = 0; k < m.params.size(); k++)
    m.hooks.push_back(autograd::register_post_accumulate_grad_hook(
        m.params[k], [impl = impl_.get(), k](const Tensor&) { impl->on_gradient(k); }));
}

GradientReducer::~GradientReducer() {
  if (!impl_) return;
  for (size_t k = 0; k < impl_->hooks.size(); k++)
    autograd::remove_post_accumulate_grad_hook(impl_->params[k], impl_->hooks[k]);
  for (Bucket& b : impl_->buckets)  // an exception left some in flight
    MPI_Wait(&b.request, MPI_STATUS_IGNORE);
}

void GradientReducer::finish() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  for (size_t bi = 0; bi < m.buckets.size(); bi++)
    if (!m.started[bi]) m.start_bucket(bi);
  // A parameter without a gradient (zeros in the sum) or with a strided one gets a new one.
  auto grad_of = [&](size_t k) {
    Tensor p = m.params[k], g = p.grad();
    if (!g.defined() || !g.is_contiguous()) {
      g = Tensor::empty(p.shape(), p.dtype());
      p.set_grad(g);
    }
    return g;
  };
  const double scale = 1.0 / double(world_size());
  for (size_t bi = 0; bi < m.buckets.size(); bi++) {
    if (m.stale[bi]) {  // what it reduced is not the gradients now: again, with them
      check(MPI_Wait(&m.buckets[bi].request, MPI_STATUS_IGNORE), "MPI_Wait");
      m.start_bucket(bi);
    }
    land(m.buckets[bi], m.params, grad_of, scale);
  }
  m.early_last = m.early;
  m.early = 0;
  for (auto* v : {&m.started, &m.stale, &m.seen}) std::fill(v->begin(), v->end(), 0);
  std::fill(m.ready.begin(), m.ready.end(), 0);
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
