// Tensor creation, views (which share storage), copies and the movement ops (concat, pad,
// index_select, gather, copy_into).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace ref;

std::vector<double> iota_values(int64_t n, double start = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) v[size_t(i)] = start + double(i);
  return v;
}

// ---- creation ----

TEST(TensorCreation, EmptyZerosOnesFull) {
  for (DType dt : kAllTypes) {
    SCOPED_TRACE(dname(dt));
    Tensor e = Tensor::empty({2, 3, 4}, dt);
    EXPECT_EQ(e.dtype(), dt);
    EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
    EXPECT_EQ(e.strides(), (Shape{12, 4, 1}));
    EXPECT_EQ(e.numel(), 24);
    EXPECT_EQ(e.dim(), 3);
    EXPECT_EQ(e.size(-1), 4);
    EXPECT_EQ(e.element_size(), opforge::dtype_size(dt));
    EXPECT_TRUE(e.is_contiguous());
    EXPECT_TRUE(e.defined());
    expect_close(Tensor::zeros({2, 3}, dt), std::vector<double>(6, 0.0), {2, 3}, dt);
    expect_close(Tensor::ones({4}, dt), std::vector<double>(4, 1.0), {4}, dt);
    expect_close(Tensor::full({3, 1}, 2, dt), std::vector<double>(3, dt == DType::Bool ? 1.0 : 2.0),
                 {3, 1}, dt);
    expect_close(Tensor::zeros({0, 3}, dt), {}, {0, 3}, dt);
    Tensor s = Tensor::scalar(1, dt);
    EXPECT_EQ(s.dim(), 0);
    EXPECT_EQ(s.numel(), 1);
    EXPECT_EQ(s.item(), 1.0);
  }
  EXPECT_FALSE(Tensor().defined());
  EXPECT_EQ(Tensor::zeros({2}).dtype(), DType::Float32);  // the default dtype
}

TEST(TensorCreation, Arange) {
  expect_close(Tensor::arange(0, 5), {0, 1, 2, 3, 4}, {5}, DType::Float32);
  expect_close(Tensor::arange(1, 2, 0.25, DType::Float64), {1, 1.25, 1.5, 1.75}, {4},
               DType::Float64);
  expect_close(Tensor::arange(5, 0, -2, DType::Int64), {5, 3, 1}, {3}, DType::Int64);
  expect_close(Tensor::arange(-3, 3, 2, DType::Int32), {-3, -1, 1}, {3}, DType::Int32);
  expect_close(Tensor::arange(3, 3), {}, {0}, DType::Float32);
  EXPECT_THROW(Tensor::arange(0, 1, 0), opforge::Error);
}

TEST(TensorCreation, RandAndRandnAreDeterministicPerSeed) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(dname(dt));
    opforge::Generator g1(42), g2(42), g3(43);
    std::vector<double> a = Tensor::rand({1000}, dt, g1).to_double_vector();
    std::vector<double> b = Tensor::rand({1000}, dt, g2).to_double_vector();
    std::vector<double> c = Tensor::rand({1000}, dt, g3).to_double_vector();
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    // the next draw continues the sequence
    std::vector<double> a2 = Tensor::rand({1000}, dt, g1).to_double_vector();
    EXPECT_NE(a, a2);
    for (double v : a) {
      EXPECT_GE(v, 0.0);
      EXPECT_LT(v, 1.0);
    }
    // re-seeding restarts it
    g1.seed(42);
    EXPECT_EQ(Tensor::rand({1000}, dt, g1).to_double_vector(), a);

    opforge::Generator n1(7), n2(7);
    std::vector<double> x = Tensor::randn({20000}, dt, n1).to_double_vector();
    EXPECT_EQ(x, Tensor::randn({20000}, dt, n2).to_double_vector());
    double mean = 0, sq = 0;
    for (double v : x) mean += v;
    mean /= double(x.size());
    for (double v : x) sq += (v - mean) * (v - mean);
    double sd = std::sqrt(sq / double(x.size()));
    EXPECT_NEAR(mean, 0.0, 0.05);
    EXPECT_NEAR(sd, 1.0, 0.05);
    EXPECT_EQ(Tensor::randn({3, 4}, dt, n1).shape(), (Shape{3, 4}));
  }
}

TEST(TensorCreation, FromVectorAndFromData) {
  Tensor f = Tensor::from_vector(std::vector<float>{1.5f, -2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  expect_close(f, {1.5, -2, 3, 4, 5, 6}, {2, 3}, DType::Float32);
  Tensor d = Tensor::from_vector(std::vector<double>{0.1, 0.2, 0.3});
  expect_close(d, {0.1, 0.2, 0.3}, {3}, DType::Float64);
  Tensor i32 = Tensor::from_vector(std::vector<int32_t>{-7, 8}, {2, 1});
  expect_close(i32, {-7, 8}, {2, 1}, DType::Int32);
  int64_t raw[4] = {1, 2, 3, int64_t(1) << 40};
  Tensor i64 = Tensor::from_data(raw, {4});
  expect_close(i64, {1, 2, 3, std::ldexp(1.0, 40)}, {4}, DType::Int64);
  EXPECT_EQ(i64.data_ptr<int64_t>()[3], int64_t(1) << 40);
  EXPECT_THROW(i64.data_ptr<float>(), opforge::Error);
  EXPECT_THROW(Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2}), opforge::Error);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1.5f, -2.f, 3.f, 4.f, 5.f, 6.f}));
  EXPECT_EQ(f.transpose(0, 1).to_vector<float>(),
            (std::vector<float>{1.5f, 4.f, -2.f, 5.f, 3.f, 6.f}));
  EXPECT_EQ(i32.to_vector<int32_t>(), (std::vector<int32_t>{-7, 8}));
  EXPECT_THROW(f.to_vector<double>(), opforge::Error);
  // copy_to_host gives row-major bytes, also of views
  float back[6];
  f.transpose(0, 1).copy_to_host(back, sizeof(back));
  std::vector<double> got(back, back + 6);
  EXPECT_EQ(got, (std::vector<double>{1.5, 4, -2, 5, 3, 6}));
  EXPECT_THROW(f.copy_to_host(back, 5), opforge::Error);
  EXPECT_THROW(f.item(), opforge::Error);
}

// ---- views share storage ----

// A [2, 3, 4] float32 tensor holding 0..23.
Tensor base234() { return make(iota_values(24), {2, 3, 4}, DType::Float32); }

// Overwrites a contiguous tensor with start, start+1, ...
void refill(Tensor& t, double start) {
  ASSERT_TRUE(t.is_contiguous());
  t.copy_from_host(make(iota_values(t.numel(), start), t.shape(), t.dtype()).data(),
                   size_t(t.numel()) * t.element_size());
}

// Checks that `view` shows base's current data through (shape, strides, offset) of base.
void expect_view_of(const Tensor& view, const Tensor& base, const Shape& shape,
                    const Shape& strides, int64_t offset) {
  EXPECT_EQ(view.storage(), base.storage()) << "the view does not share the base's storage";
  EXPECT_EQ(view.shape(), shape);
  std::vector<double> b = base.to_double_vector();
  expect_close(view, strided_values(b, shape, strides, offset), shape, base.dtype());
}

TEST(TensorViews, TransposeAndPermuteShareStorage) {
  Tensor base = base234();
  Tensor t = base.transpose(0, 2);  // [4, 3, 2]
  expect_view_of(t, base, {4, 3, 2}, {1, 4, 12}, 0);
  EXPECT_FALSE(t.is_contiguous());
  Tensor p = base.permute({2, 0, 1});  // [4, 2, 3]
  expect_view_of(p, base, {4, 2, 3}, {1, 12, 4}, 0);
  // modify the base: both views see it
  refill(base, 100);
  expect_view_of(t, base, {4, 3, 2}, {1, 4, 12}, 0);
  expect_view_of(p, base, {4, 2, 3}, {1, 12, 4}, 0);
  EXPECT_EQ(t.to_double_vector()[1], 112.0);  // t[0][0][1] is base[1][0][0]
  // negative dims
  expect_view_of(base.transpose(-1, -3), base, {4, 3, 2}, {1, 4, 12}, 0);
}

TEST(TensorViews, ReshapeAndView) {
  Tensor base = base234();
  Tensor r = base.reshape({-1, 4});
  expect_view_of(r, base, {6, 4}, {4, 1}, 0);
  expect_view_of(base.reshape({4, -1}), base, {4, 6}, {6, 1}, 0);
  expect_view_of(base.view({24}), base, {24}, {1}, 0);
  expect_view_of(base.flatten(), base, {24}, {1}, 0);
  expect_view_of(base.reshape({2, 1, 12}), base, {2, 1, 12}, {12, 12, 1}, 0);
  // a transposed tensor cannot be viewed flat: reshape copies, view refuses
  Tensor t = base.transpose(0, 2);
  Tensor flat = t.reshape({-1});
  EXPECT_NE(flat.storage(), base.storage());
  expect_close(flat, t.to_double_vector(), {24}, DType::Float32);
  EXPECT_THROW(t.view({24}), opforge::Error);
  refill(base, 50);
  expect_view_of(r, base, {6, 4}, {4, 1}, 0);
  EXPECT_EQ(flat.to_double_vector()[0], 0.0);  // the copy kept the old data
}

TEST(TensorViews, ExpandUsesStrideZero) {
  Tensor base = make({1, 2, 3}, {3, 1}, DType::Float64);
  Tensor e = base.expand({2, 3, 4});
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(e.strides()[2], 0);
  expect_view_of(e, base, {2, 3, 4}, {0, 1, 0}, 0);
  expect_view_of(base.expand({-1, 5}), base, {3, 5}, {1, 0}, 0);
  refill(base, 10);
  expect_view_of(e, base, {2, 3, 4}, {0, 1, 0}, 0);
  EXPECT_THROW(base.expand({2, 4}), opforge::Error);
}

TEST(TensorViews, SliceWithStepsAndNegativeIndices) {
  Tensor v = make(iota_values(10), {10}, DType::Int64);
  expect_view_of(v.slice(0, 1, 8, 3), v, {3}, {3}, 1);   // 1 4 7
  expect_view_of(v.slice(0, -3, 100), v, {3}, {1}, 7);   // 7 8 9: stop clamped
  expect_view_of(v.slice(0, -100, 2), v, {2}, {1}, 0);   // 0 1: start clamped
  expect_view_of(v.slice(0, 2, -2, 2), v, {3}, {2}, 2);  // 2 4 6
  EXPECT_EQ(v.slice(0, 5, 2).numel(), 0);                // empty
  EXPECT_EQ(v.slice(0, 20, 30).numel(), 0);              // entirely out of range: empty
  Tensor base = base234();
  Tensor s = base.slice(2, 1, -1).slice(1, 0, 3, 2);  // [2, 2, 2]
  expect_view_of(s, base, {2, 2, 2}, {12, 8, 1}, 1);
  refill(base, 1000);
  expect_view_of(s, base, {2, 2, 2}, {12, 8, 1}, 1);
  EXPECT_EQ(s.to_double_vector()[0], 1001.0);
}

TEST(TensorViews, SelectSqueezeUnsqueeze) {
  Tensor base = base234();
  expect_view_of(base.select(1, -1), base, {2, 4}, {12, 1}, 8);
  expect_view_of(base.select(0, 1), base, {3, 4}, {4, 1}, 12);
  expect_view_of(base.select(-1, 2), base, {2, 3}, {12, 4}, 2);
  Tensor u = base.unsqueeze(1);
  EXPECT_EQ(u.shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(u.storage(), base.storage());
  EXPECT_EQ(base.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(base.unsqueeze(0).shape(), (Shape{1, 2, 3, 4}));
  EXPECT_EQ(u.squeeze(1).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(base.squeeze(0).shape(), (Shape{2, 3, 4}));  // not size 1: unchanged
  expect_close(u.squeeze(1), base.to_double_vector(), {2, 3, 4}, DType::Float32);
}

TEST(TensorViews, WritesThroughAViewReachTheBase) {
  Tensor base = Tensor::zeros({3, 4}, DType::Float32);
  // write row 1 through a select view, and every other column of row 2 through a slice
  opforge::copy_into(base.select(0, 1), make({1, 2, 3, 4}, {4}, DType::Float32));
  opforge::copy_into(base.select(0, 2).slice(0, 0, 4, 2), make({7, 8}, {2}, DType::Float32));
  expect_close(base, {0, 0, 0, 0, 1, 2, 3, 4, 7, 0, 8, 0}, {3, 4}, DType::Float32);
  // write through a transposed view
  Tensor t = base.transpose(0, 1);  // [4, 3]
  opforge::copy_into(t.select(0, 3), make({-1, -2, -3}, {3}, DType::Float32));
  expect_close(base, {0, 0, 0, -1, 1, 2, 3, -2, 7, 0, 8, -3}, {3, 4}, DType::Float32);
}

// ---- copies ----

TEST(TensorCopies, ContiguousCloneTo) {
  for (DType dt : kAllTypes) {
    SCOPED_TRACE(dname(dt));
    Tensor base = random({4, 6}, dt, Data::Normal, "copies" + dname(dt));
    EXPECT_EQ(base.contiguous().storage(), base.storage());  // already dense: no copy
    Tensor t = base.transpose(0, 1);
    Tensor c = t.contiguous();
    EXPECT_TRUE(c.is_contiguous());
    EXPECT_NE(c.storage(), base.storage());
    expect_close(c, t.to_double_vector(), {6, 4}, dt);
    Tensor sl = base.slice(1, 1, 6, 2);
    expect_close(sl.contiguous(), sl.to_double_vector(), {4, 3}, dt);
    // clone: new storage, same values, independent afterwards
    Tensor k = base.clone();
    EXPECT_NE(k.storage(), base.storage());
    std::vector<double> before = base.to_double_vector();
    expect_close(k, before, {4, 6}, dt);
    refill(k, 1);
    expect_close(base, before, {4, 6}, dt);
    expect_close(t.clone(), t.to_double_vector(), {6, 4}, dt);
    // to(): the same tensor for the same dtype, a cast otherwise
    EXPECT_EQ(base.to(dt).storage(), base.storage());
    for (DType other : kAllTypes) {
      if (other == dt) continue;
      SCOPED_TRACE("to " + dname(other));
      std::vector<double> want;
      for (double v : t.to_double_vector()) want.push_back(cast_value(v, other));
      expect_close(t.to(other), want, {6, 4}, other);
    }
  }
  // float -> int truncates toward zero
  expect_close(make({-2.75, -0.5, 0.5, 2.75}, {4}, DType::Float64).to(DType::Int32), {-2, 0, 0, 2},
               {4}, DType::Int32);
}

// ---- movement ops ----

TEST(Movement, Concat) {
  for (DType dt : kAllTypes) {
    SCOPED_TRACE(dname(dt));
    auto r = [&](const Shape& s, const std::string& tag) {
      return random(s, dt, Data::Normal, "concat" + tag + dname(dt));
    };
    struct C {
      std::vector<Tensor> xs;
      int axis;
      std::string label;
    };
    std::vector<C> cases = {
        {{r({2, 3, 4}, "a"), r({1, 3, 4}, "b"), r({3, 3, 4}, "c")}, 0, "axis 0"},
        {{r({2, 3, 4}, "d"), r({2, 5, 4}, "e")}, 1, "axis 1"},
        {{r({2, 3, 4}, "f"), r({2, 3, 1}, "g"), r({2, 3, 2}, "h")}, 2, "axis 2"},
        {{r({2, 3, 4}, "i"), r({2, 3, 2}, "j")}, -1, "axis -1"},
        {{r({7}, "k"), r({33}, "l")}, 0, "1-D"},
        {{r({4, 2}, "m").transpose(0, 1), r({2, 6}, "n").slice(1, 0, 6, 2)},
         1,
         "non-contiguous inputs"},
        {{r({2, 0}, "o"), r({2, 3}, "p")}, 1, "an empty input"},
        {{r({3, 2}, "q")}, 0, "a single input"},
    };
    for (const auto& c : cases) {
      SCOPED_TRACE("concat " + c.label);
      std::vector<Dense> ds;
      for (const auto& x : c.xs) ds.push_back(dense(x));
      expect_close(opforge::concat(c.xs, c.axis), concat(ds, c.axis), dt);
    }
  }
}

TEST(Movement, Pad) {
  for (DType dt : kAllTypes) {
    SCOPED_TRACE(dname(dt));
    Tensor x = random({2, 3}, dt, Data::Normal, "pad" + dname(dt));
    double value = dt == DType::Bool ? 1 : 7;
    expect_close(opforge::pad(x, {{1, 2}, {0, 1}}, value), pad(dense(x), {{1, 2}, {0, 1}}, value),
                 dt);
    expect_close(opforge::pad(x, {{0, 0}, {3, 0}}), pad(dense(x), {{0, 0}, {3, 0}}, 0), dt);
    expect_close(opforge::pad(x, {{0, 0}, {0, 0}}), dense(x).v, {2, 3}, dt);
    Tensor y = random({2, 3, 4}, dt, Data::Normal, "pad3" + dname(dt));
    expect_close(opforge::pad(y, {{1, 0}, {2, 2}, {0, 3}}, value),
                 pad(dense(y), {{1, 0}, {2, 2}, {0, 3}}, value), dt);
    Tensor t = y.transpose(0, 2);  // [4, 3, 2], non-contiguous
    expect_close(opforge::pad(t, {{1, 1}, {0, 1}, {2, 0}}, value),
                 pad(dense(t), {{1, 1}, {0, 1}, {2, 0}}, value), dt);
  }
}

TEST(Movement, IndexSelect) {
  for (DType dt : kAllTypes) {
    SCOPED_TRACE(dname(dt));
    Tensor x = random({5, 4, 6}, dt, Data::Normal, "index_select" + dname(dt));
    std::vector<int64_t> idx = {4, 0, 0, 2, 4};
    for (DType it : {DType::Int64, DType::Int32}) {
      Tensor index = make(std::vector<double>(idx.begin(), idx.end()), {5}, it);
      SCOPED_TRACE("index dtype " + dname(it));
      expect_close(opforge::index_select(x, 0, index), take(dense(x), 0, idx), dt);
      std::vector<int64_t> idx1 = {3, 1, 1, 0, 2};
      Tensor index1 = make(std::vector<double>(idx1.begin(), idx1.end()), {5}, it);
      expect_close(opforge::index_select(x, 1, index1), take(dense(x), 1, idx1), dt);
      expect_close(opforge::index_select(x, -1, index), take(dense(x), 2, idx), dt);
    }
    Tensor xt = x.transpose(0, 2);  // [6, 4, 5]
    Tensor index = make({5, 0, 3}, {3}, DType::Int64);
    SCOPED_TRACE("non-contiguous input");
    expect_close(opforge::index_select(xt, 0, index), take(dense(xt), 0, {5, 0, 3}), dt);
    expect_close(opforge::index_select(xt, 1, make({}, {0}, DType::Int64)), take(dense(xt), 1, {}),
                 dt);
  }
}

TEST(Movement, GatherIsNumpyTake) {
  for (DType dt : kAllTypes) {
    SCOPED_TRACE(dname(dt));
    Tensor x = random({4, 5, 3}, dt, Data::Normal, "gather" + dname(dt));
    // 1-D index with a negative entry (counts from the end)
    std::vector<int64_t> idx = {1, -1, 0, 3};
    Tensor index = make({1, -1, 0, 3}, {4}, DType::Int64);
    expect_close(opforge::gather(x, 1, index), take(dense(x), 1, idx), dt);
    // 2-D index: the index's shape replaces the gathered axis
    Tensor index2 = make({0, 2, 3, 3, 1, 0}, {2, 3}, DType::Int64);
    Expected flat = take(dense(x), 0, {0, 2, 3, 3, 1, 0});
    Tensor got = opforge::gather(x, 0, index2);
    expect_close(got, flat.values, {2, 3, 5, 3}, dt);
    Expected last = take(dense(x), 2, {2, 0, 1, 1, 0, 2});
    // x [4, 5, 3] gathered on axis 2 with a [2, 3] index -> [4, 5, 2, 3]; take gives [4, 5, 6] in
    // the same order
    expect_close(opforge::gather(x, -1, make({2, 0, 1, 1, 0, 2}, {2, 3}, DType::Int64)),
                 last.values, {4, 5, 2, 3}, dt);
  }
}

TEST(Movement, CopyIntoBroadcasts) {
  for (DType dt : kAllTypes) {
    SCOPED_TRACE(dname(dt));
    Tensor dst = Tensor::zeros({3, 4}, dt);
    Tensor row = random({4}, dt, Data::NonZero, "copy_into row" + dname(dt));
    opforge::copy_into(dst, row);
    expect_close(dst,
                 broadcast_eval({Dense{std::vector<double>(12, 0.0), {3, 4}}, dense(row)},
                                [](const std::vector<double>& v) { return v[1]; }),
                 dt);
    Tensor col = random({3, 1}, dt, Data::NonZero, "copy_into col" + dname(dt));
    opforge::copy_into(dst, col);
    expect_close(dst,
                 broadcast_eval({Dense{std::vector<double>(12, 0.0), {3, 4}}, dense(col)},
                                [](const std::vector<double>& v) { return v[1]; }),
                 dt);
    // into a strided view: only the viewed elements change
    Tensor base = Tensor::zeros({4, 6}, dt);
    Tensor view = base.slice(1, 1, 6, 2);  // [4, 3]
    Tensor src = random({3}, dt, Data::NonZero, "copy_into view" + dname(dt));
    opforge::copy_into(view, src);
    std::vector<double> want(24, 0.0), s = src.to_double_vector();
    for (int r = 0; r < 4; r++)
      for (int c = 0; c < 3; c++) want[size_t(r * 6 + 1 + 2 * c)] = s[size_t(c)];
    expect_close(base, want, {4, 6}, dt);
    // a same-shape copy from a non-contiguous source
    Tensor dst2 = Tensor::zeros({6, 4}, dt);
    Tensor srcT = random({4, 6}, dt, Data::Normal, "copy_into t" + dname(dt)).transpose(0, 1);
    opforge::copy_into(dst2, srcT);
    expect_close(dst2, srcT.to_double_vector(), {6, 4}, dt);
  }
}

}  // namespace

namespace {
TEST(MovementExtra, CopyIntoCastsToTheDestinationDtype) {
  // Like PyTorch's copy_: the source is converted to the destination's dtype.
  Tensor dst = Tensor::zeros({4, 5}, DType::Float32);
  opforge::copy_into(dst, Tensor::full({5}, 3, DType::Int32));
  EXPECT_EQ(dst.to_double_vector(), std::vector<double>(20, 3.0));
}
}  // namespace
