// The data side of training: IDX files (written here with zlib, gzip and plain) read back exactly,
// every broken file a clear Error, and the DataLoader's epochs (each sample once, the order a
// function of seed and epoch, batches intact across its background thread).
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "opforge/torch/data.hpp"

namespace {
using namespace opforge;
using namespace opforge::torch::data;

std::vector<uint8_t> idx(uint8_t type, std::vector<uint32_t> dims, size_t data_bytes) {
  std::vector<uint8_t> b = {0, 0, type, uint8_t(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(d >> s));
  for (size_t i = 0; i < data_bytes; i++) b.push_back(uint8_t(i * 7 % 256));
  return b;
}
// Under a folder of this process's own: the extra test configurations run this binary at once.
std::string write(const std::string& name, const std::vector<uint8_t>& bytes, bool gzip) {
  struct Folder {
    std::string path = testing::TempDir() + "opforge_idx_" + std::to_string(getpid()) + "/";
    Folder() { std::filesystem::create_directories(path); }
    ~Folder() { std::filesystem::remove_all(path); }
  };
  static const Folder dir;
  std::string path = dir.path + name;
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), unsigned(bytes.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  return path;
}
void expect_error(const std::string& path, const std::string& what) {
  try {
    read_idx_images(path);
    FAIL() << path << " must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(TorchData, IdxFilesReadBackExactly) {
  for (bool gz : {true, false}) {
    std::string p = write(gz ? "img.gz" : "img", idx(8, {3, 2, 4}, 24), gz);
    Tensor t = read_idx_images(p);
    ASSERT_EQ(t.shape(), (Shape{3, 1, 2, 4}));
    auto v = t.to_double_vector();
    for (size_t i = 0; i < v.size(); i++) EXPECT_EQ(v[i], double(float(i * 7 % 256) / 255.0f));
    Tensor l = read_idx_labels(write("lab", idx(8, {5}, 5), gz));
    EXPECT_EQ(l.to_vector<int64_t>(), (std::vector<int64_t>{0, 7, 14, 21, 28}));
  }
}

TEST(TorchData, BrokenIdxFilesAreClearErrors) {
  expect_error(testing::TempDir() + "nothing-here", "no such file");
  expect_error(write("short", {0, 0}, false), "too short");
  expect_error(write("magic", {1, 2, 8, 3, 0, 0, 0, 1}, false), "not an IDX file");
  expect_error(write("float", idx(0x0D, {1, 1, 1}, 4), false), "element type");
  expect_error(write("rank", idx(8, {4}, 4), false), "expected 3");
  expect_error(write("truncated", idx(8, {2, 2, 2}, 7), true), "bytes of data");
  expect_error(write("huge", idx(8, {0xFFFFFFFF, 0xFFFFFFFF, 2}, 4), false), "more bytes");
  auto gz = idx(8, {2, 2, 2}, 8);
  std::string p = write("corrupt.gz", gz, true);
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    f.write("garbage!", 8);
  }
  EXPECT_THROW(read_idx_images(p), Error);
  EXPECT_THROW(load_fashion_mnist(testing::TempDir() + "no-such-folder"), Error);
}

Dataset numbered(int64_t n) {
  std::vector<float> img(static_cast<size_t>(n) * 3);
  std::vector<int64_t> lab(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) {
    for (int k = 0; k < 3; k++) img[size_t(i * 3 + k)] = float(i);
    lab[size_t(i)] = i;
  }
  return {Tensor::from_vector(img, {n, 3}), Tensor::from_vector(lab, {n})};
}

std::vector<int64_t> epoch_order(DataLoader& dl, int64_t epoch) {
  dl.start_epoch(epoch);
  std::vector<int64_t> order;
  while (auto b = dl.next()) {
    auto img = b->images.to_double_vector();
    auto lab = b->labels.to_vector<int64_t>();
    for (size_t i = 0; i < lab.size(); i++) {
      EXPECT_EQ(img[i * 3], double(lab[i]));  // each image stays with its label
      order.push_back(lab[i]);
    }
  }
  return order;
}

TEST(TorchData, LoaderEpochsCoverEverySampleInASeededOrder) {
  DataLoader a(numbered(103), 10, true, 5), b(numbered(103), 10, true, 5);
  EXPECT_EQ(a.batches_per_epoch(), 11);
  auto e0 = epoch_order(a, 0), e1 = epoch_order(a, 1);
  EXPECT_EQ(e0.size(), 103u);
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), 103u);
  EXPECT_NE(e0, e1);
  EXPECT_EQ(epoch_order(b, 0), e0);  // the same seed and epoch give the same order
  EXPECT_EQ(epoch_order(a, 0), e0);
  DataLoader plain(numbered(25), 10, false, 0, true);
  auto o = epoch_order(plain, 0);
  ASSERT_EQ(o.size(), 20u);  // drop_last
  for (size_t i = 0; i < o.size(); i++) EXPECT_EQ(o[i], int64_t(i));
  // an epoch restarted half-way starts from its first batch
  a.start_epoch(0);
  a.next();
  EXPECT_EQ(epoch_order(a, 0), e0);
  EXPECT_THROW(DataLoader(numbered(4), 0), Error);
}

TEST(TorchData, LoaderBatchSizeChangesMidEpoch) {
  // The epoch's order stays; batches from the next on have the new size (a batch prepared at
  // the old one is cut again), the last one short.
  DataLoader dl(numbered(10), 3, false);
  dl.start_epoch(0);
  std::vector<std::vector<int64_t>> got;
  got.push_back(dl.next()->labels.to_vector<int64_t>());
  dl.set_batch_size(4);
  EXPECT_EQ(dl.batch_size(), 4);
  EXPECT_EQ(dl.batches_per_epoch(), 3);  // one handed out, then 4 + 3
  while (auto b = dl.next()) got.push_back(b->labels.to_vector<int64_t>());
  EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5, 6}, {7, 8, 9}}));
  // An epoch started part-way (a resumed run): from that sample of its order on.
  dl.start_epoch(0, 5);
  EXPECT_EQ(dl.next()->labels.to_vector<int64_t>(), (std::vector<int64_t>{5, 6, 7, 8}));
  EXPECT_EQ(dl.next()->labels.to_vector<int64_t>(), (std::vector<int64_t>{9}));
  EXPECT_FALSE(dl.next());
  EXPECT_THROW(dl.start_epoch(0, 11), Error);
  // Shuffled: every sample of the epoch's order once, however the size changes.
  DataLoader sh(numbered(103), 10, true, 5), same(numbered(103), 10, true, 5);
  std::vector<int64_t> want = epoch_order(same, 0), order;
  sh.start_epoch(0);
  int64_t k = 0;
  while (auto b = sh.next()) {
    for (int64_t v : b->labels.to_vector<int64_t>()) order.push_back(v);
    sh.set_batch_size(++k % 2 ? 7 : 16);
  }
  EXPECT_EQ(order, want);
  sh.start_epoch(1);  // the size stays for the next epoch
  EXPECT_EQ(sh.next()->labels.size(0), sh.batch_size());
  EXPECT_THROW(sh.set_batch_size(0), Error);
}

}  // namespace
