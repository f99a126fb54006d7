// Training over several processes (torch::distributed, OpenMPI). These tests run under mpirun:
// ctest's distributed_two_ranks starts two ranks of this executable; on their own they skip.
// Every rank checks: the parameters are bit-identical on all ranks after every step, and two
// ranks with global batch B reach the parameters of one process with batch B (float64).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <set>

#include "opforge/opforge.hpp"
#include "opforge/torch/data.hpp"
#include "opforge/torch/distributed.hpp"
#include "opforge/torch/nn.hpp"
#include "opforge/torch/optim.hpp"
#include "opforge/torch/parallel.hpp"
#include "small_mlp.hpp"

namespace {
using namespace opforge;
using namespace opforge::torch;

bool ready() {
  if (!distributed::available() || !distributed::launched()) return false;
  distributed::init();
  return true;
}
#define NEEDS_RANKS() \
  if (!ready())       \
  GTEST_SKIP() << "run under mpirun (ctest: distributed_two_ranks), in a build with MPI"

// FNV-1a over every parameter's bytes: equal only if the parameters are bit-identical.
uint64_t fingerprint(const std::vector<Tensor>& params) {
  uint64_t h = 1469598103934665603ull;
  for (const Tensor& p : params) {
    std::vector<double> v = p.to_vector<double>();
    const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
    for (size_t i = 0; i < v.size() * sizeof(double); i++) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

data::Dataset dataset(int64_t n) {
  Generator g(77);
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) labels[size_t(i)] = (i * 3 + 1) % 5;
  return {sub(mul(Tensor::rand({n, 12}, DType::Float64, g), 4.0), 2.0),
          Tensor::from_vector(labels)};
}

// No MPI needed: three ranks' shards of each batch hold exactly the samples of one process's
// batch (labels are the sample numbers here), the last batch short as well.
TEST(DistributedSampler, TheRanksTogetherHoldEachBatchOfOneProcess) {
  const int64_t n = 50;
  std::vector<int64_t> id(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) id[size_t(i)] = i;
  data::Dataset d{Tensor::zeros({n, 2}), Tensor::from_vector(id)};
  data::DataLoader one(d, 12, true, 9);
  std::vector<std::unique_ptr<data::DataLoader>> ranks;
  for (int r = 0; r < 3; r++) {
    ranks.push_back(std::make_unique<data::DataLoader>(d, 4, true, 9));
    ranks.back()->shard(r, 3);
    ranks.back()->start_epoch(1);
  }
  one.start_epoch(1);
  EXPECT_EQ(ranks[0]->samples_per_epoch(), 17);  // 50 samples dealt to 3: padded to 51
  EXPECT_EQ(ranks[0]->batches_per_epoch(), one.batches_per_epoch());
  std::set<int64_t> seen;
  int64_t first = -1;  // the epoch's first sample, which pads the ranks' last batch
  while (std::optional<data::Batch> b = one.next()) {
    std::multiset<int64_t> want, got;
    for (int64_t v : b->labels.to_vector<int64_t>()) want.insert(v);
    if (first < 0) first = b->labels.to_vector<int64_t>()[0];
    for (auto& r : ranks) {
      std::optional<data::Batch> p = r->next();
      ASSERT_TRUE(p);
      for (int64_t v : p->labels.to_vector<int64_t>()) got.insert(v);
    }
    if (b->index + 1 == one.batches_per_epoch()) want.insert(first);
    EXPECT_EQ(got, want) << "batch " << b->index;
    seen.insert(want.begin(), want.end());
  }
  for (auto& r : ranks) EXPECT_FALSE(r->next());
  EXPECT_EQ(seen.size(), size_t(n));
  EXPECT_THROW(ranks[0]->shard(3, 3), Error);
}

// Two epochs of SGD on the ranks, each on its part of every batch, against one process with the
// whole batch. data_parallel: each rank splits its part over its own devices (nn::DataParallel,
// whose gradients reach the reducer at finish() rather than during the backward pass).
void train_as_one_process(bool data_parallel) {
  const int world = distributed::world_size(), rank = distributed::rank();
  // Whole batches on every world size: a short last batch would give ranks unequal parts, whose
  // means averaged are not the batch's mean (DDP's too).
  const int64_t batch = 16 * world, samples = 3 * batch;
  nn::CrossEntropyLoss criterion;
  optim::SGDOptions o{.lr = 0.1, .momentum = 0.9};

  // One process, the whole batch: what every rank must reach.
  auto single = small_mlp(5);
  optim::SGD opt1(single->parameters(), o);
  data::DataLoader all(dataset(samples), batch, true, 3);

  // This rank: its part of each batch. Its initial parameters differ until rank 0's arrive.
  auto mine = small_mlp(5);
  if (rank != 0) {
    autograd::NoGradGuard no_grad;
    mine->parameters()[0].add_(double(rank));
  }
  distributed::broadcast(mine->parameters());
  distributed::check_same(fingerprint(mine->parameters()), "initial parameters");
  optim::SGD opt2(mine->parameters(), o);
  // 256-byte buckets: the gradients of the last layer's bias, its weight, ... each its own,
  // started as backward() reaches them.
  distributed::GradientReducer reducer(mine->parameters(), 256);
  ASSERT_GE(reducer.buckets(), 3u);
  data::DataLoader part(dataset(samples), batch / world, true, 3);
  part.shard(rank, world);
  std::vector<Device> local;
  for (const DeviceInfo& d : devices())
    if (d.device.kind == DeviceKind::cpu) local.push_back(d.device);
  nn::DataParallel dp(mine, local);

  for (int64_t epoch = 0; epoch < 2; epoch++) {
    all.start_epoch(epoch);
    part.start_epoch(epoch);
    ASSERT_EQ(part.batches_per_epoch(), all.batches_per_epoch());
    while (std::optional<data::Batch> b = all.next()) {
      opt1.zero_grad();
      criterion((*single)(b->images), b->labels).backward();
      opt1.step();

      std::optional<data::Batch> p = part.next();
      ASSERT_TRUE(p);
      opt2.zero_grad();
      if (data_parallel) {
        dp.forward_backward(p->images, p->labels, criterion);
      } else {
        criterion((*mine)(p->images), p->labels).backward();
      }
      reducer.finish();
      if (!data_parallel) {
        EXPECT_GT(reducer.started_during_backward(), 0u) << "no bucket overlapped the backward";
      }
      opt2.step();
      distributed::check_same(fingerprint(mine->parameters()), "parameters after a step");
    }
  }
  std::vector<Tensor> want = single->parameters(), got = mine->parameters();
  for (size_t j = 0; j < want.size(); j++) {
    std::vector<double> w = want[j].to_vector<double>(), g = got[j].to_vector<double>();
    for (size_t k = 0; k < w.size(); k++)
      ASSERT_NEAR(g[k], w[k], 1e-10 + 1e-9 * std::abs(w[k])) << "parameter " << j << " " << k;
  }
}

TEST(Distributed, TwoRanksTrainAsOneProcessWithTheWholeBatch) {
  NEEDS_RANKS();
  train_as_one_process(false);
}

TEST(Distributed, EachRankMaySplitItsPartOverItsDevices) {
  NEEDS_RANKS();
  train_as_one_process(true);
}

TEST(Distributed, AReducerOverTwoBackwardPassesAveragesTheirSum) {
  NEEDS_RANKS();
  const int rank = distributed::rank();
  // Gradients accumulated over two micro-batches before finish(): the buckets that started
  // after the first pass are reduced again with both.
  auto with_reducer = small_mlp(21), plain = small_mlp(21);
  distributed::GradientReducer reducer(with_reducer->parameters(), 256);
  nn::CrossEntropyLoss criterion;
  data::Dataset d = dataset(40);
  for (int half = 0; half < 2; half++) {
    Tensor x = d.images.slice(0, 20 * half + rank, 20 * half + rank + 10);
    Tensor y = d.labels.slice(0, 20 * half + rank, 20 * half + rank + 10);
    criterion((*with_reducer)(x), y).backward();
    criterion((*plain)(x), y).backward();
  }
  reducer.finish();
  std::vector<Tensor> want;
  for (const Tensor& p : plain->parameters()) want.push_back(p.grad());
  distributed::all_reduce_mean(want);
  std::vector<Tensor> got = with_reducer->parameters();
  // Two ranks' sums are exact whatever the buckets; more ranks may add in another order when the
  // buckets (and so the all-reduce's segments) differ: float32 rounding.
  const double rel = distributed::world_size() == 2 ? 0.0 : 4e-7;
  for (size_t j = 0; j < want.size(); j++) {
    std::vector<double> w = want[j].to_vector<double>(), g = got[j].grad().to_vector<double>();
    for (size_t k = 0; k < w.size(); k++)
      ASSERT_NEAR(g[k], w[k], rel * std::abs(w[k])) << "parameter " << j << " " << k;
  }
}

TEST(Distributed, AllReduceAveragesEveryElementInBuckets) {
  NEEDS_RANKS();
  const int world = distributed::world_size(), rank = distributed::rank();
  // Mixed dtypes and sizes, 64-byte buckets: one tensor per bucket or several, in order.
  std::vector<Tensor> ts = {Tensor::empty({3}, DType::Float32), Tensor::empty({40}, DType::Float64),
                            Tensor::empty({2}, DType::Float64), Tensor(),
                            Tensor::empty({5, 7}, DType::Float32)};
  for (size_t i = 0; i < ts.size(); i++) {
    if (!ts[i].defined()) continue;
    std::vector<double> v(size_t(ts[i].numel()));
    for (size_t k = 0; k < v.size(); k++) v[k] = double(rank + 1) * double(k + 1) + double(i);
    ts[i].copy_(Tensor::from_vector(v, ts[i].shape()));
  }
  distributed::all_reduce_mean(ts, 64);
  const double mean_factor = double(world + 1) / 2;  // the mean of rank + 1 over the ranks
  for (size_t i = 0; i < ts.size(); i++) {
    if (!ts[i].defined()) continue;
    std::vector<double> got = ts[i].to(DType::Float64).to_vector<double>();
    for (size_t k = 0; k < got.size(); k++)
      ASSERT_NEAR(got[k], mean_factor * double(k + 1) + double(i), 1e-5 * double(k + 2))
          << "tensor " << i << " element " << k;
  }
  EXPECT_THROW(distributed::all_reduce_mean({Tensor::zeros({2}, DType::Int64)}), Error);
}

TEST(Distributed, RanksThatDisagreeAreRefused) {
  NEEDS_RANKS();
  if (distributed::world_size() < 2) GTEST_SKIP() << "needs two ranks";
  try {
    distributed::check_same(uint64_t(distributed::rank()), "model");
    ADD_FAILURE() << "different fingerprints were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1's model differs"), std::string::npos) << e.what();
  }
}

TEST(Distributed, ABuildOrProcessWithoutMpiSaysSo) {
  if (distributed::available()) {
    // MPI is started only under a launcher: a singleton MPI in ctest's processes would outlive
    // the test and meet the other tests' forks.
    if (!distributed::launched()) GTEST_SKIP() << "MPI is built; run under mpirun to start it";
    EXPECT_NO_THROW(distributed::init());
    EXPECT_GE(distributed::world_size(), 1);
  } else {
    try {
      distributed::init();
      ADD_FAILURE() << "init() without MPI did not raise";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("libopenmpi-dev"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
