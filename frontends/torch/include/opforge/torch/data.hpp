// opforge::torch::data: the data side of training. IDX files (MNIST's and Fashion-MNIST's format,
// gzip-compressed or not), the Fashion-MNIST data set, and a DataLoader that shuffles with a seed
// and prepares the next batch on a background thread while the current one trains.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "opforge/tensor.hpp"

namespace opforge::torch::data {

// An IDX file of unsigned bytes (gzip-compressed or not): images become float32 in [0, 1]
// (PyTorch's ToTensor), labels int64. A bad file (missing, not IDX, another element type or rank,
// a size that does not match its header) is an Error naming it and what was wrong.
Tensor read_idx_images(const std::string& path);  // (N, 1, rows, cols) float32 in [0, 1]
Tensor read_idx_labels(const std::string& path);  // (N) int64

struct Dataset {
  Tensor images;  // (N, 1, 28, 28) float32
  Tensor labels;  // (N) int64
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};
struct FashionMnist {
  Dataset train, test;
};
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir`; an Error says which file is missing
// and where the data set comes from.
FashionMnist load_fashion_mnist(const std::string& dir = kFashionMnistDir);
// The first n samples of d (all if n <= 0 or n >= d.size()).
Dataset head(const Dataset& d, int64_t n);

struct Batch {
  Tensor images, labels;
  int64_t index = 0;  // of the batch in its epoch, counted from where start_epoch started it
};

// Batches of a data set in the order of a permutation drawn from (seed, epoch), or in order when
// shuffle is off; the last short batch is kept unless drop_last. While the caller trains on one
// batch, a background thread gathers the next.
class DataLoader {
 public:
  DataLoader(Dataset d, int64_t batch_size, bool shuffle = true, uint64_t seed = 0,
             bool drop_last = false);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts epoch `epoch` (its order depends on seed and epoch only), from the sample at
  // `first_sample` of its order (this rank's part) on: a run resumed within an epoch.
  void start_epoch(int64_t epoch, int64_t first_sample = 0);
  // Makes this loader rank `rank` of `world` processes (PyTorch's DistributedSampler): each
  // epoch's order, the same on every rank, is extended by its own start to a multiple of world
  // and dealt out, rank r taking positions r, r + world, ...; batches are then made of this
  // rank's part. With batch size B / world on each rank, batch k of the ranks together holds
  // the samples of batch k of one process with batch size B. Takes effect at the next
  // start_epoch().
  void shard(int rank, int world);
  int64_t samples_per_epoch() const;
  // The next batch of the epoch, or nullopt at its end. An error in the background thread is
  // raised here.
  std::optional<Batch> next();
  // The epoch's batches from where start_epoch started it: those handed out, and the rest at
  // the current batch size.
  int64_t batches_per_epoch() const;
  int64_t batch_size() const { return batch_size_; }
  // The batches from the next one on have `n` samples (the epoch's order stays; a batch already
  // prepared at the old size is cut again).
  void set_batch_size(int64_t n);
  const Dataset& dataset() const { return d_; }

 private:
  Batch gather(const std::vector<int64_t>& order, int64_t first, int64_t n, int64_t index) const;
  void work();

  Dataset d_;
  int64_t batch_size_;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  int rank_ = 0, world_ = 1;
  std::shared_ptr<const std::vector<int64_t>> order_;  // the epoch's; the worker holds a copy

  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Batch> ready_;  // the prepared batch
  std::string error_;
  int64_t wanted_ = 0;      // the batch the worker prepares next
  int64_t first_ = 0;       // the sample (place in the epoch's order) it starts at
  int64_t consumed_ = 0;    // batches next() has handed out this epoch
  int64_t taken_ = 0;       // and their samples
  int64_t generation_ = 0;  // bumped by start_epoch: a batch of an older epoch is dropped
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace opforge::torch::data
