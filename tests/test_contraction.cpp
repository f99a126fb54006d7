// matmul (NumPy semantics: 1-D promotion, batch broadcasting), gemm (alpha, beta, C broadcast,
// transposes) and linear (bias, ReLU, batch dims) against the float64 reference.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace ref;

class MatmulTest : public ::testing::TestWithParam<DType> {};

void check_matmul(const Tensor& a, const Tensor& b, DType dt, const std::string& label) {
  SCOPED_TRACE("matmul " + label + ": " + sstr(a.shape()) + " @ " + sstr(b.shape()) + " at " +
               dname(dt));
  Expected want = matmul(dense(a), dense(b));
  int64_t K = a.shape().back();
  Tensor got;
  try {
    got = opforge::matmul(a, b);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw: " << e.what();
    return;
  }
  expect_close(got, want, dt, accum_tol(dt, K));
}

TEST_P(MatmulTest, TwoDimensional) {
  DType dt = GetParam();
  struct MKN {
    int64_t m, k, n;
  };
  for (MKN s : {MKN{1, 1, 1}, MKN{7, 33, 5}, MKN{64, 64, 64}, MKN{130, 70, 90}, MKN{1, 33, 1},
                MKN{33, 1, 7}, MKN{1, 1023, 3}, MKN{5, 3, 1023}}) {
    std::string label = std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
    Tensor a = random({s.m, s.k}, dt, Data::Normal, "mm a " + label);
    Tensor b = random({s.k, s.n}, dt, Data::Normal, "mm b " + label);
    check_matmul(a, b, dt, label);
  }
}

TEST_P(MatmulTest, OneDimensionalOperands) {
  DType dt = GetParam();
  Tensor v = random({33}, dt, Data::Normal, "mm v");
  Tensor m = random({33, 7}, dt, Data::Normal, "mm m");
  Tensor mt = random({7, 33}, dt, Data::Normal, "mm mt");
  check_matmul(v, m, dt, "1-D @ 2-D");                                       // -> [7]
  check_matmul(mt, v, dt, "2-D @ 1-D");                                      // -> [7]
  check_matmul(v, random({33}, dt, Data::Normal, "mm w"), dt, "1-D @ 1-D");  // -> []
  check_matmul(random({5}, dt, Data::Normal, "mm v5"), random({3, 5, 6}, dt, Data::Normal, "mm b3"),
               dt,
               "1-D @ 3-D");  // -> [3, 6]
  check_matmul(random({3, 4, 5}, dt, Data::Normal, "mm a3"),
               random({5}, dt, Data::Normal, "mm v5b"), dt,
               "3-D @ 1-D");  // -> [3, 4]
}

TEST_P(MatmulTest, BatchedWithBroadcasting) {
  DType dt = GetParam();
  auto r = [&](const Shape& s, const std::string& tag) {
    return random(s, dt, Data::Normal, "mm batch " + tag);
  };
  check_matmul(r({2, 1, 4, 5}, "a1"), r({3, 5, 6}, "b1"), dt, "[2, 1, 4, 5] @ [3, 5, 6]");
  check_matmul(r({3, 4, 5}, "a2"), r({3, 5, 6}, "b2"), dt, "same batch");
  check_matmul(r({3, 4, 5}, "a3"), r({5, 6}, "b3"), dt, "3-D @ 2-D");
  check_matmul(r({4, 5}, "a4"), r({2, 5, 6}, "b4"), dt, "2-D @ 3-D");
  check_matmul(r({1, 4, 5}, "a5"), r({3, 5, 6}, "b5"), dt, "batch 1 broadcast");
  check_matmul(r({2, 3, 7, 9}, "a6"), r({2, 3, 9, 4}, "b6"), dt, "4-D");
}

TEST_P(MatmulTest, NonContiguousInputs) {
  DType dt = GetParam();
  Tensor at = random({33, 7}, dt, Data::Normal, "mm t a").transpose(0, 1);  // [7, 33]
  Tensor bt = random({5, 33}, dt, Data::Normal, "mm t b").transpose(0, 1);  // [33, 5]
  Tensor a = random({7, 33}, dt, Data::Normal, "mm c a");
  Tensor b = random({33, 5}, dt, Data::Normal, "mm c b");
  check_matmul(at, b, dt, "transposed A");
  check_matmul(a, bt, dt, "transposed B");
  check_matmul(at, bt, dt, "both transposed");
  check_matmul(random({7, 66}, dt, Data::Normal, "mm s a").slice(1, 0, 66, 2), b, dt,
               "step-2 slice A");
  check_matmul(random({3, 6, 4}, dt, Data::Normal, "mm bt a").transpose(1, 2),
               random({3, 6, 5}, dt, Data::Normal, "mm bt b"), dt, "batched transposed A");
  check_matmul(random({4, 5}, dt, Data::Normal, "mm e a"),
               random({1, 5, 6}, dt, Data::Normal, "mm e b").expand({3, 5, 6}), dt,
               "expanded batch of B");
}

TEST_P(MatmulTest, EmptyOperands) {
  DType dt = GetParam();
  // K = 0: the product is all zeros; M = 0: an empty result
  check_matmul(Tensor::ones({3, 0}, dt), Tensor::ones({0, 4}, dt), dt, "K = 0");
  check_matmul(Tensor::ones({0, 5}, dt), random({5, 4}, dt, Data::Normal, "mm empty"), dt, "M = 0");
}

INSTANTIATE_TEST_SUITE_P(Floats, MatmulTest, ::testing::ValuesIn(kFloatTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return dname(i.param); });

// ---- gemm ----

class GemmTest : public ::testing::TestWithParam<DType> {};

void check_gemm(const Tensor& a, const Tensor& b, const Tensor& c, double alpha, double beta,
                bool ta, bool tb, DType dt, const std::string& label) {
  SCOPED_TRACE("gemm " + label + ": A " + sstr(a.shape()) + (ta ? "^T" : "") + ", B " +
               sstr(b.shape()) + (tb ? "^T" : "") + ", C " +
               (c.defined() ? sstr(c.shape()) : "none") + ", alpha " + std::to_string(alpha) +
               ", beta " + std::to_string(beta) + " at " + dname(dt));
  std::optional<Dense> cd;
  if (c.defined()) cd = dense(c);
  Expected want = gemm(dense(a), dense(b), cd, alpha, beta, ta, tb);
  int64_t K = ta ? a.shape()[0] : a.shape()[1];
  Tensor got;
  try {
    got = opforge::gemm(a, b, c, alpha, beta, ta, tb);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw: " << e.what();
    return;
  }
  expect_close(got, want, dt, accum_tol(dt, K));
}

TEST_P(GemmTest, AlphaBetaAndCBroadcast) {
  DType dt = GetParam();
  struct MKN {
    int64_t m, k, n;
  };
  for (MKN s : {MKN{1, 1, 1}, MKN{7, 33, 5}, MKN{64, 64, 64}, MKN{130, 70, 90}}) {
    std::string tag = std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
    Tensor a = random({s.m, s.k}, dt, Data::Normal, "gemm a " + tag);
    Tensor b = random({s.k, s.n}, dt, Data::Normal, "gemm b " + tag);
    Tensor cmn = random({s.m, s.n}, dt, Data::Normal, "gemm c " + tag);
    Tensor cn = random({s.n}, dt, Data::Normal, "gemm cn " + tag);
    Tensor cm1 = random({s.m, 1}, dt, Data::Normal, "gemm cm1 " + tag);
    Tensor c1n = random({1, s.n}, dt, Data::Normal, "gemm c1n " + tag);
    check_gemm(a, b, cmn, 1, 1, false, false, dt, tag + " defaults");
    check_gemm(a, b, cmn, 0.5, 2, false, false, dt, tag + " C [M, N]");
    check_gemm(a, b, cn, 0.5, -1.5, false, false, dt, tag + " C [N]");
    check_gemm(a, b, cm1, 2, 0.25, false, false, dt, tag + " C [M, 1]");
    check_gemm(a, b, c1n, 1, 3, false, false, dt, tag + " C [1, N]");
    check_gemm(a, b, cmn, 1.5, 0, false, false, dt, tag + " beta 0");
    check_gemm(a, b, Tensor(), 1.5, 2, false, false, dt, tag + " no C");
  }
}

TEST_P(GemmTest, Transposes) {
  DType dt = GetParam();
  int64_t M = 9, K = 17, N = 6;
  Tensor a = random({M, K}, dt, Data::Normal, "gemm t a");
  Tensor at = random({K, M}, dt, Data::Normal, "gemm t at");  // op(A) = at^T
  Tensor b = random({K, N}, dt, Data::Normal, "gemm t b");
  Tensor bt = random({N, K}, dt, Data::Normal, "gemm t bt");  // op(B) = bt^T
  Tensor c = random({M, N}, dt, Data::Normal, "gemm t c");
  Tensor cn = random({N}, dt, Data::Normal, "gemm t cn");
  check_gemm(at, b, c, 0.5, 2, true, false, dt, "trans_a");
  check_gemm(a, bt, c, 0.5, 2, false, true, dt, "trans_b");
  check_gemm(at, bt, cn, 0.5, 2, true, true, dt, "trans_a and trans_b");
  check_gemm(at, bt, Tensor(), 1, 1, true, true, dt, "both, no C");
  // non-contiguous operands as well as the transpose flags
  check_gemm(a.transpose(0, 1), b, c, 1, 1, true, false, dt, "trans_a of a transposed view");
  check_gemm(random({M, 2 * K}, dt, Data::Normal, "gemm s a").slice(1, 0, 2 * K, 2), bt, c, 1, 1,
             false, true, dt, "sliced A, trans_b");
}

INSTANTIATE_TEST_SUITE_P(Floats, GemmTest, ::testing::ValuesIn(kFloatTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return dname(i.param); });

// ---- linear ----

class LinearTest : public ::testing::TestWithParam<DType> {};

void check_linear(const Tensor& x, const Tensor& w, const Tensor& b, bool relu, DType dt,
                  const std::string& label) {
  SCOPED_TRACE("linear " + label + ": x " + sstr(x.shape()) + ", W " + sstr(w.shape()) + ", bias " +
               (b.defined() ? sstr(b.shape()) : "none") + (relu ? ", relu" : "") + " at " +
               dname(dt));
  std::optional<Dense> bd;
  if (b.defined()) bd = dense(b);
  Expected want = linear(dense(x), dense(w), bd, relu);
  Tensor got;
  try {
    got = opforge::linear(x, w, b, relu ? opforge::Activation::relu : opforge::Activation::none);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw: " << e.what();
    return;
  }
  expect_close(got, want, dt, accum_tol(dt, x.shape().back()));
}

TEST_P(LinearTest, ShapesBiasAndRelu) {
  DType dt = GetParam();
  struct MKN {
    int64_t m, k, n;
  };
  // Below, at and past the hand schedule's whole blocks (64 x 16), K a whole number of vectors
  // and not.
  for (MKN s : {MKN{1, 1, 1}, MKN{7, 33, 5}, MKN{16, 64, 64}, MKN{130, 70, 90}, MKN{128, 784, 512},
                MKN{33, 17, 130}}) {
    std::string tag = std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
    Tensor x = random({s.m, s.k}, dt, Data::Normal, "linear x " + tag);
    Tensor w = random({s.n, s.k}, dt, Data::Normal, "linear w " + tag);
    Tensor b = random({s.n}, dt, Data::Normal, "linear b " + tag);
    for (bool relu : {false, true}) {
      check_linear(x, w, b, relu, dt, tag);
      check_linear(x, w, Tensor(), relu, dt, tag + " no bias");
    }
  }
}

TEST_P(LinearTest, BatchDimsViewsAndEmpty) {
  DType dt = GetParam();
  Tensor w = random({20, 24}, dt, Data::Normal, "linear w");
  Tensor b = random({20}, dt, Data::Normal, "linear b");
  check_linear(random({2, 3, 24}, dt, Data::Normal, "linear x3"), w, b, true, dt, "3-D input");
  check_linear(random({24}, dt, Data::Normal, "linear x1"), w, b, false, dt, "1-D input");
  // strided input, transposed weight (copied to rows), strided bias
  Tensor xs = random({17, 48}, dt, Data::Normal, "linear xs").slice(1, 0, 48, 2);
  Tensor wt = random({24, 20}, dt, Data::Normal, "linear wt").transpose(0, 1);
  Tensor bs = random({40}, dt, Data::Normal, "linear bs").slice(0, 0, 40, 2);
  check_linear(xs, wt, bs, true, dt, "views");
  check_linear(random({0, 24}, dt, Data::Normal, "linear x0"), w, b, false, dt, "no rows");
  // No features: the bias alone, through the ReLU.
  Tensor y = opforge::linear(Tensor::zeros({3, 0}, dt), Tensor::zeros({20, 0}, dt), b,
                             opforge::Activation::relu);
  expect_close(
      y,
      linear(dense(Tensor::zeros({3, 0}, dt)), dense(Tensor::zeros({20, 0}, dt)), dense(b), true),
      dt, accum_tol(dt, 1));
}

TEST(Linear, BadShapesAreClearErrors) {
  Tensor x = Tensor::ones({3, 4}), w = Tensor::ones({5, 4});
  EXPECT_OPFORGE_ERROR(opforge::linear(x, Tensor::ones({5, 3})), "expects 3");
  EXPECT_OPFORGE_ERROR(opforge::linear(x, Tensor::ones({4})), "out_features");
  EXPECT_OPFORGE_ERROR(opforge::linear(x, w, Tensor::ones({4})), "bias has shape");
}

INSTANTIATE_TEST_SUITE_P(Floats, LinearTest, ::testing::ValuesIn(kFloatTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return dname(i.param); });

}  // namespace
