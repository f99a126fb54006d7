// Training over several processes and machines with OpenMPI (torch.distributed's role): ranks
// started by `mpirun`, the initial parameters broadcast from rank 0, and gradients averaged with
// MPI_Allreduce on host tensors, in buckets of about 25 MB that are all in flight at once. A build
// without MPI (Debian's libopenmpi-dev) has available() false, and everything else raises an
// Error that says so.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "opforge/tensor.hpp"

namespace opforge::torch::distributed {

// Whether this build has MPI.
bool available();
// Whether this process was started by mpirun (or another MPI launcher).
bool launched();
// Starts MPI once per process (later calls do nothing); MPI is finalized at exit. A process not
// started by a launcher is a world of one.
void init();
int rank();
int world_size();
void barrier();

// Copies root's tensors into every rank's (the same shapes and dtypes on every rank).
void broadcast(const std::vector<Tensor>& tensors, int root = 0);
// Replaces each tensor by its mean over the ranks, in place: float32 and float64 host tensors,
// packed into buckets of at most bucket_bytes (one tensor larger than that is a bucket alone),
// each reduced with a non-blocking MPI_Iallreduce, all in flight at once, in the same order on
// every rank. Undefined tensors are skipped (every rank must skip the same ones).
void all_reduce_mean(const std::vector<Tensor>& tensors, size_t bucket_bytes = size_t(25) << 20);
// The same with the sum over the ranks (torch.distributed.all_reduce's default).
void all_reduce_sum(const std::vector<Tensor>& tensors, size_t bucket_bytes = size_t(25) << 20);
// Averages gradients over the ranks while backward() runs, as DDP's reducer does: the parameters
// in buckets of about bucket_bytes, the last parameters first (their gradients come first in a
// backward pass), each bucket's MPI_Iallreduce started as soon as backward() has added into every
// gradient in it (post-accumulate hooks), so communication overlaps the rest of the backward
// pass. finish() starts what is left (a parameter without a gradient counts as zeros), waits for
// every bucket and writes the means into the gradients. Every rank must run the same graph, so
// that its buckets complete in the same order. A second backward() before finish() (gradients
// accumulated over micro-batches) is right too: a bucket started early is reduced again. Gradients
// set other ways (DataParallel's sum) are all reduced in finish().
class GradientReducer {
 public:
  // The first bucket (the last layers') holds at most first_bucket_bytes, as DDP's: it starts
  // early, while the first layers' gradients are still being computed.
  explicit GradientReducer(std::vector<Tensor> params, size_t bucket_bytes = size_t(25) << 20,
                           size_t first_bucket_bytes = size_t(1) << 20);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;
  void finish();
  size_t buckets() const;
  // Of the last finish(): the buckets that were started during the backward pass.
  size_t started_during_backward() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Ends every rank of the job with exit status `code` (MPI_Abort) when this process is one of
// several: an error that only some ranks meet (a file one cannot write) would leave the others
// waiting in their next all-reduce. Does nothing otherwise.
void abort_job(int code);

// Raises an Error naming the first rank whose `fingerprint` differs from rank 0's (a hash of what
// must agree: the model's parameter shapes, the data's size), with `what` in the message.
void check_same(uint64_t fingerprint, const char* what);

}  // namespace opforge::torch::distributed
