// IDX files through zlib (which reads plain files too), and the DataLoader's background thread.
#include "opforge/torch/data.hpp"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>

#include "opforge/ops.hpp"

namespace opforge::torch::data {
namespace {
std::vector<uint8_t> read_all(const std::string& path) {
  OPFORGE_CHECK(std::filesystem::exists(path)) << path << ": no such file";
  gzFile f = gzopen(path.c_str(), "rb");
  OPFORGE_CHECK(f) << path << ": cannot open it";
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  int err = 0;
  std::string msg = n < 0 ? gzerror(f, &err) : "";
  gzclose(f);
  OPFORGE_CHECK(n == 0) << path << ": the gzip stream is corrupt (" << msg << ")";
  return out;
}

uint32_t big_endian(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

// The dims of an IDX file of unsigned bytes with `rank` dims, and where its data starts.
Shape idx_header(const std::string& path, const std::vector<uint8_t>& bytes, int rank,
                 size_t& data_at) {
  OPFORGE_CHECK(bytes.size() >= 4) << path << ": too short for an IDX header";
  OPFORGE_CHECK(bytes[0] == 0 && bytes[1] == 0)
      << path << ": not an IDX file (its first two bytes are not zero)";
  OPFORGE_CHECK(bytes[2] == 0x08) << path << ": IDX element type 0x" << std::hex << int(bytes[2])
                                  << ", expected 0x08 (unsigned bytes)";
  OPFORGE_CHECK(bytes[3] == rank) << path << ": an IDX file of " << int(bytes[3])
                                  << " dims, expected " << rank;
  data_at = 4 + 4 * size_t(rank);
  OPFORGE_CHECK(bytes.size() >= data_at) << path << ": too short for its " << rank << " dims";
  Shape dims;
  uint64_t count = 1;
  for (int d = 0; d < rank; d++) {
    dims.push_back(int64_t(big_endian(&bytes[4 + 4 * size_t(d)])));
    count *= uint64_t(dims.back());
    OPFORGE_CHECK(count <= bytes.size())
        << path << ": its dims " << shape_str(dims) << " hold more bytes than the file";
  }
  OPFORGE_CHECK(bytes.size() - data_at == count)
      << path << ": " << bytes.size() - data_at << " bytes of data, its dims " << shape_str(dims)
      << " say " << count;
  return dims;
}

// path, or path.gz when only that exists.
std::string either(const std::string& dir, const std::string& name) {
  std::string plain = dir + "/" + name;
  if (std::filesystem::exists(plain)) return plain;
  std::string gz = plain + ".gz";
  OPFORGE_CHECK(std::filesystem::exists(gz))
      << "Fashion-MNIST: " << gz << " is missing (the Debian package dataset-fashion-mnist "
      << "installs the data set in " << kFashionMnistDir << "; or pass the folder that holds it)";
  return gz;
}
}  // namespace

Tensor read_idx_images(const std::string& path) {
  std::vector<uint8_t> bytes = read_all(path);
  size_t at = 0;
  Shape d = idx_header(path, bytes, 3, at);
  Tensor t = Tensor::empty({d[0], 1, d[1], d[2]}, DType::Float32);
  float* p = t.data_ptr<float>();
  for (size_t i = 0; i < bytes.size() - at; i++) p[i] = float(bytes[at + i]) / 255.0f;
  return t;
}

Tensor read_idx_labels(const std::string& path) {
  std::vector<uint8_t> bytes = read_all(path);
  size_t at = 0;
  Shape d = idx_header(path, bytes, 1, at);
  Tensor t = Tensor::empty({d[0]}, DType::Int64);
  int64_t* p = t.data_ptr<int64_t>();
  for (size_t i = 0; i < bytes.size() - at; i++) p[i] = bytes[at + i];
  return t;
}

FashionMnist load_fashion_mnist(const std::string& dir) {
  FashionMnist f;
  for (auto [set, prefix] : {std::pair{&f.train, "train"}, std::pair{&f.test, "t10k"}}) {
    std::string images = either(dir, std::string(prefix) + "-images-idx3-ubyte");
    std::string labels = either(dir, std::string(prefix) + "-labels-idx1-ubyte");
    set->images = read_idx_images(images);
    set->labels = read_idx_labels(labels);
    OPFORGE_CHECK(set->images.size(0) == set->labels.size(0))
        << images << " holds " << set->images.size(0) << " images, " << labels << " "
        << set->labels.size(0) << " labels";
    OPFORGE_CHECK(set->images.size(2) == 28 && set->images.size(3) == 28)
        << images << ": images of " << set->images.size(2) << "x" << set->images.size(3)
        << ", Fashion-MNIST's are 28x28";
    double top = opforge::max(set->labels).item();
    OPFORGE_CHECK(top <= 9) << labels << ": a label " << top << ", Fashion-MNIST's are 0 to 9";
  }
  return f;
}

Dataset head(const Dataset& d, int64_t n) {
  if (n <= 0 || n >= d.size()) return d;
  return {d.images.slice(0, 0, n).contiguous(), d.labels.slice(0, 0, n).contiguous()};
}

DataLoader::DataLoader(Dataset d, int64_t batch_size, bool shuffle, uint64_t seed, bool drop_last)
    : d_(std::move(d)),
      batch_size_(batch_size),
      shuffle_(shuffle),
      drop_last_(drop_last),
      seed_(seed) {
  OPFORGE_CHECK(batch_size > 0) << "DataLoader: batch size must be positive, got " << batch_size;
  OPFORGE_CHECK(d_.images.defined() && d_.labels.defined() && d_.images.dim() >= 1 &&
                d_.images.size(0) == d_.labels.size(0))
      << "DataLoader: images and labels must be defined and hold the same number of samples";
  d_.images = d_.images.contiguous();
  d_.labels = d_.labels.contiguous();
  start_epoch(0);
  worker_ = std::thread([this] { work(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void DataLoader::shard(int rank, int world) {
  OPFORGE_CHECK(world >= 1 && rank >= 0 && rank < world)
      << "DataLoader::shard: rank " << rank << " of " << world << " processes";
  OPFORGE_CHECK(d_.size() >= world) << "DataLoader::shard: " << d_.size()
                                    << " samples cannot be shared by " << world << " processes";
  std::lock_guard<std::mutex> lk(mu_);  // the worker reads them for batches_per_epoch()
  rank_ = rank;
  world_ = world;
}

int64_t DataLoader::samples_per_epoch() const { return (d_.size() + world_ - 1) / world_; }

int64_t DataLoader::batches_per_epoch() const {
  const int64_t n = samples_per_epoch() - taken_;
  return consumed_ + (drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_);
}

void DataLoader::set_batch_size(int64_t n) {
  OPFORGE_CHECK(n > 0) << "DataLoader: batch size must be positive, got " << n;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (n == batch_size_) return;
    batch_size_ = n;
    generation_++;  // a batch being gathered at the old size is dropped
    ready_.reset();
    error_.clear();
    wanted_ = consumed_;
    first_ = taken_;
  }
  cv_.notify_all();
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_sample) {
  OPFORGE_CHECK(first_sample >= 0 && first_sample <= samples_per_epoch())
      << "DataLoader: an epoch of " << samples_per_epoch() << " samples cannot start at sample "
      << first_sample;
  auto order = std::make_shared<std::vector<int64_t>>(size_t(d_.size()));
  std::iota(order->begin(), order->end(), 0);
  if (shuffle_) {
    // Fisher-Yates on mt19937_64's output, each index by a 64x64-bit multiply-shift (bias below
    // n / 2^64), not std::shuffle, whose draws differ between standard libraries: the order is
    // the same everywhere.
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + uint64_t(epoch));
    for (size_t i = order->size(); i > 1; i--) {
      size_t j = size_t((static_cast<unsigned __int128>(rng()) * i) >> 64);
      std::swap((*order)[i - 1], (*order)[j]);
    }
  }
  if (world_ > 1) {
    auto mine = std::make_shared<std::vector<int64_t>>();
    const size_t n = order->size();
    for (size_t k = 0; k < size_t(samples_per_epoch()); k++)
      mine->push_back((*order)[(size_t(rank_) + k * size_t(world_)) % n]);
    order = std::move(mine);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    order_ = std::move(order);
    generation_++;
    ready_.reset();
    error_.clear();
    wanted_ = 0;
    first_ = first_sample;
    consumed_ = 0;
    taken_ = first_sample;
  }
  cv_.notify_all();
}

Batch DataLoader::gather(const std::vector<int64_t>& order, int64_t first, int64_t n,
                         int64_t index) const {
  n = std::min(n, int64_t(order.size()) - first);
  Shape is = d_.images.shape();
  is[0] = n;
  Batch b{Tensor::empty(is, d_.images.dtype()), Tensor::empty({n}, d_.labels.dtype()), index};
  const size_t row =
      size_t(d_.images.numel() / std::max<int64_t>(d_.size(), 1)) * d_.images.element_size();
  const auto* src = static_cast<const char*>(d_.images.const_data());
  const auto* lsrc = static_cast<const int64_t*>(d_.labels.const_data());
  auto* dst = static_cast<char*>(b.images.data());
  auto* ldst = b.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; i++) {
    int64_t s = order[size_t(first + i)];
    std::memcpy(dst + size_t(i) * row, src + size_t(s) * row, row);
    ldst[i] = lsrc[s];
  }
  return b;
}

void DataLoader::work() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk,
             [&] { return stop_ || (!ready_ && error_.empty() && wanted_ < batches_per_epoch()); });
    if (stop_) return;
    const int64_t index = wanted_, first = first_, size = batch_size_, generation = generation_;
    std::shared_ptr<const std::vector<int64_t>> order = order_;
    lk.unlock();
    std::optional<Batch> b;
    std::string error;
    try {
      b = gather(*order, first, size, index);
    } catch (const std::exception& e) {
      error = e.what();
    }
    lk.lock();
    if (generation != generation_) continue;  // start_epoch came meanwhile
    if (!error.empty()) {
      error_ = error;
    } else {
      first_ += b->labels.size(0);
      ready_ = std::move(b);
      wanted_++;
    }
    cv_.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  std::unique_lock<std::mutex> lk(mu_);
  if (consumed_ >= batches_per_epoch()) return std::nullopt;
  cv_.wait(lk, [&] { return ready_.has_value() || !error_.empty(); });
  OPFORGE_CHECK(error_.empty()) << "DataLoader: preparing batch " << wanted_
                                << " failed: " << error_;
  std::optional<Batch> b = std::move(ready_);
  ready_.reset();
  consumed_++;
  taken_ += b->labels.size(0);
  lk.unlock();
  cv_.notify_all();
  return b;
}

}  // namespace opforge::torch::data
