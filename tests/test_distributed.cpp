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

// Every element of got against want (float64 tensors of one shape).
void expect_all_near(const Tensor& got, const Tensor& want, double tol, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); i++)
    ASSERT_NEAR(g[i], w[i], tol * (1 + std::abs(w[i]))) << what << " element " << i;
}

// SyncBatchNorm on each rank's rows of a batch against BatchNorm2d on the whole batch in one
// process (every rank makes the whole batch from one seed): the result's rows, the input's
// gradient's rows, the running statistics, and the weight's and bias's gradients summed over the
// ranks, all to float64 rounding.
TEST(Distributed, SyncBatchNormNormalisesOverEveryRanksBatch) {
  NEEDS_RANKS();
  const int world = distributed::world_size(), rank = distributed::rank();
  const int64_t per_rank = 3, C = 4;
  Generator gen(21);
  const Tensor x =
      add(mul(Tensor::randn({per_rank * world, C, 3, 2}, DType::Float64, gen), 2.0), 5.0);
  const Tensor up = Tensor::randn(x.shape(), DType::Float64, gen);
  const Tensor w0 = Tensor::randn({C}, DType::Float64, gen),
               b0 = Tensor::randn({C}, DType::Float64, gen);
  auto set_affine = [&](nn::BatchNorm2d& bn) {
    autograd::NoGradGuard no_grad;
    bn.weight.copy_(w0);
    bn.bias.copy_(b0);
  };
  nn::BatchNorm2d whole(C, 1e-5, 0.1, true, DType::Float64);
  nn::SyncBatchNorm part(C, 1e-5, 0.1, true, DType::Float64);
  set_affine(whole);
  set_affine(part);
  const Tensor xw = x.detach().requires_grad_();
  whole(xw).backward(up);
  const int64_t first = per_rank * rank;
  const Tensor xp = x.slice(0, first, first + per_rank).contiguous().requires_grad_();
  const Tensor y = part(xp);
  y.backward(up.slice(0, first, first + per_rank).contiguous());
  nn::BatchNorm2d again(C, 1e-5, 0.1, true, DType::Float64);
  set_affine(again);
  expect_all_near(y.detach(), again(x).detach().slice(0, first, first + per_rank).contiguous(),
                  1e-12, "result");
  expect_all_near(xp.grad(), xw.grad().slice(0, first, first + per_rank).contiguous(), 1e-10,
                  "input gradient");
  expect_all_near(part.running_mean, whole.running_mean, 1e-12, "running mean");
  expect_all_near(part.running_var, whole.running_var, 1e-12, "running variance");
  Tensor dw = part.weight.grad().contiguous(), db = part.bias.grad().contiguous();
  distributed::all_reduce_sum({dw, db});
  expect_all_near(dw, whole.weight.grad(), 1e-10, "weight gradient");
  expect_all_near(db, whole.bias.grad(), 1e-10, "bias gradient");
}

// linear -> batch normalisation (Norm: SyncBatchNorm or BatchNorm2d, on (N, 8, 1, 1)) -> relu ->
// linear, in float64, the same initial parameters for the same seed.
template <class Norm>
struct NormNet : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<Norm> norm;
  explicit NormNet(uint64_t seed) {
    Generator g(seed);
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(12, 8, true, DType::Float64, g));
    norm = register_module("norm", std::make_shared<Norm>(8, 1e-5, 0.1, true, DType::Float64));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 5, true, DType::Float64, g));
  }
  Tensor forward(const Tensor& x) override {
    const int64_t n = x.size(0);
    Tensor h = (*norm)((*fc1)(x).reshape({n, 8, 1, 1})).reshape({n, 8});
    return (*fc2)(relu(h));
  }
  std::string name() const override { return "NormNet"; }
};

// SyncBatchNorm's all-reduces inside the backward pass, among the gradients' buckets started
// during it: three SGD steps on each rank's rows of a batch give every rank the parameters of one
// process with BatchNorm2d over the whole batch, bit-identical on all ranks. `mine`: a network
// with SyncBatchNorm, or one with BatchNorm2d converted by convert_sync_batchnorm.
template <class Norm>
void trains_as_one_process(NormNet<Norm>& mine) {
  const int world = distributed::world_size(), rank = distributed::rank();
  const int64_t rows = 4;
  NormNet<nn::BatchNorm2d> whole(9);
  distributed::GradientReducer reducer(mine.parameters(), 128, 128);  // buckets start early
  nn::CrossEntropyLoss criterion;
  data::Dataset d = dataset(rows * world * 3);
  auto sgd = [](nn::Module& m) {
    autograd::NoGradGuard no_grad;
    for (Tensor& p : m.parameters()) p.add_(p.grad(), -0.1);
    m.zero_grad();
  };
  for (int64_t step = 0; step < 3; step++) {
    const int64_t first = step * rows * world;
    Tensor x = d.images.slice(0, first, first + rows * world),
           y = d.labels.slice(0, first, first + rows * world);
    criterion(whole(x), y).backward();
    sgd(whole);
    criterion(mine(x.slice(0, rank * rows, (rank + 1) * rows)),
              y.slice(0, rank * rows, (rank + 1) * rows))
        .backward();
    reducer.finish();
    sgd(mine);
    distributed::check_same(fingerprint(mine.parameters()), "parameters after a step");
  }
  const std::vector<Tensor> got = mine.parameters(), want = whole.parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < got.size(); j++) expect_all_near(got[j], want[j], 1e-10, "parameter");
  expect_all_near(mine.norm->running_mean, whole.norm->running_mean, 1e-12, "running mean");
  expect_all_near(mine.norm->running_var, whole.norm->running_var, 1e-12, "running variance");
}
TEST(Distributed, SyncBatchNormTrainsAsOneProcessWithTheWholeBatch) {
  NEEDS_RANKS();
  NormNet<nn::SyncBatchNorm> mine(9);
  trains_as_one_process(mine);
}
TEST(Distributed, ConvertedBatchNormTrainsAsOneProcessWithTheWholeBatch) {
  NEEDS_RANKS();
  NormNet<nn::BatchNorm2d> mine(9);
  EXPECT_EQ(&nn::SyncBatchNorm::convert_sync_batchnorm(mine), &mine);
  EXPECT_EQ(mine.norm->name(), "SyncBatchNorm");
  trains_as_one_process(mine);
}

// Without mpirun, SyncBatchNorm is batch normalisation over the process's batch, (N, C) inputs
// too; in evaluation it uses the running statistics.
TEST(SyncBatchNormAlone, IsBatchNormOverTheProcesssBatch) {
  if (distributed::launched()) GTEST_SKIP() << "started by mpirun: the ranks' test covers it";
  Generator gen(5);
  for (const Shape& shape : {Shape{6, 3, 2, 2}, Shape{7, 3}}) {
    SCOPED_TRACE(shape_str(shape));
    const Tensor x = Tensor::randn(shape, DType::Float64, gen);
    nn::SyncBatchNorm sync(3, 1e-5, 0.1, true, DType::Float64);
    const Tensor xs = x.detach().requires_grad_();
    const Tensor y = sync(xs);
    y.backward(Tensor::ones(shape, DType::Float64));
    // The reference: the batch's mean and biased variance per channel, in float64 here.
    std::vector<int> axes{0};
    for (int d = 2; d < x.dim(); d++) axes.push_back(d);
    Shape per_channel(shape.size(), 1);
    per_channel[1] = 3;
    const Tensor m = mean(x, axes).reshape(per_channel),
                 v = var(x, axes, false, 0.0).reshape(per_channel);
    expect_all_near(y.detach(), div(sub(x, m), sqrt(add(v, 1e-5))), 1e-12, "result");
    // With an upstream gradient of ones, the normalised values' gradient is 0.
    expect_all_near(xs.grad(), Tensor::zeros(shape, DType::Float64), 1e-10, "input gradient");
    sync.eval();
    EXPECT_NO_THROW(sync(x));
  }
  nn::SyncBatchNorm wrong(4);
  EXPECT_THROW(wrong(Tensor::zeros({2, 3})), Error);
  EXPECT_THROW(wrong(Tensor::zeros({4})), Error);
}

// convert_sync_batchnorm reaches every BatchNorm2d of a module tree, nested ones too, and keeps
// the layers themselves: their parameters, buffers and training mode.
TEST(SyncBatchNormAlone, ConvertReachesEveryBatchNormOfATree) {
  auto inner = std::make_shared<nn::Sequential>();
  inner->push_back(std::make_shared<nn::BatchNorm2d>(3));
  nn::Sequential outer;
  outer.push_back(std::make_shared<nn::Conv2d>(2, 3, 1));
  outer.push_back(inner);
  outer.push_back(std::make_shared<nn::BatchNorm2d>(3));
  outer.eval();
  const auto before = outer.state_dict();
  nn::SyncBatchNorm::convert_sync_batchnorm(outer);
  EXPECT_EQ(outer.named_children()[0].second->name(), "Conv2d");
  EXPECT_EQ(inner->named_children()[0].second->name(), "SyncBatchNorm");
  EXPECT_EQ(outer.named_children()[2].second->name(), "SyncBatchNorm");
  EXPECT_FALSE(outer.named_children()[2].second->is_training());
  const auto after = outer.state_dict();
  ASSERT_EQ(after.size(), before.size());
  for (const auto& [name, t] : before) {
    ASSERT_TRUE(after.count(name)) << name;
    EXPECT_EQ(after.at(name).data(), t.data()) << name << " is no longer the layer's own tensor";
  }
  // Converted, a layer takes what SyncBatchNorm takes: (N, C) inputs too.
  outer.train();
  EXPECT_NO_THROW(outer.named_children()[2].second->forward(Tensor::ones({4, 3})));
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
