// safetensors files: a round trip of every dtype and layout, the byte layout the format defines
// (and the reference writer produces), and a clear Error for each kind of broken file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "opforge/opforge.hpp"
#include "reference.hpp"

namespace {
using namespace ref;
namespace fs = std::filesystem;

// This process's scratch folder, removed when the process ends.
struct ScratchDir {
  fs::path path = fs::temp_directory_path() / ("opforge_safetensors_" + std::to_string(getpid()));
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

std::string temp_path(const std::string& name) {
  static ScratchDir dir;
  fs::create_directories(dir.path);
  return (dir.path / name).string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A file as the format defines it: the header's length (8 bytes, little-endian), the header, the
// data.
std::string file_of(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; i++) out[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  return out + header + data;
}

TEST(Safetensors, RoundTripOfEveryDtypeAndLayout) {
  std::map<std::string, Tensor> in;
  in["w.f32"] = random({3, 5}, DType::Float32, Data::Normal, "st/f32");
  in["w.f64"] = random({2, 2, 3}, DType::Float64, Data::Normal, "st/f64");
  in["i32"] = random({7}, DType::Int32, Data::Normal, "st/i32");
  in["i64"] = random({2, 3}, DType::Int64, Data::Normal, "st/i64");
  in["mask"] = random({4, 2}, DType::Bool, Data::Normal, "st/bool");
  in["transposed"] = random({4, 6}, DType::Float32, Data::Normal, "st/t").transpose(0, 1);
  in["scalar"] = Tensor::scalar(3.25, DType::Float64);
  in["empty"] = Tensor::empty({0, 3});
  std::string path = temp_path("round_trip.safetensors");
  opforge::save_safetensors(path, in, {{"format", "pt"}, {"step", "12"}});
  opforge::SafetensorsFile f = opforge::load_safetensors(path);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("step"), "12");
  ASSERT_EQ(f.tensors.size(), in.size());
  for (const auto& [name, t] : in) {
    const Tensor& got = f.tensors.at(name);
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    EXPECT_EQ(got.shape(), t.shape()) << name;
    EXPECT_EQ(got.to_double_vector(), t.to_double_vector()) << name;  // bit-exact
  }
}

TEST(Safetensors, ByteLayoutIsTheFormats) {
  Tensor a = Tensor::from_vector(std::vector<float>{1.0f, -2.5f});
  Tensor b = Tensor::from_vector(std::vector<int64_t>{7, -1, 3}, {3, 1});
  std::string path = temp_path("layout.safetensors");
  opforge::save_safetensors(path, {{"b", b}, {"a", a}});
  std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  EXPECT_EQ((8 + n) % 8, 0u) << "the header is padded to a multiple of 8";
  std::string header = bytes.substr(8, n);
  // Tensors in name order, each with its byte range; spaces pad the header.
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"I64","shape":[3,1],"data_offsets":[8,32]}})");
  ASSERT_EQ(bytes.size(), 8 + n + 32);
  float fa[2];
  int64_t ib[3];
  std::memcpy(fa, bytes.data() + 8 + n, 8);
  std::memcpy(ib, bytes.data() + 8 + n + 8, 24);
  EXPECT_EQ(fa[0], 1.0f);
  EXPECT_EQ(fa[1], -2.5f);
  EXPECT_EQ(ib[0], 7);
  EXPECT_EQ(ib[1], -1);
  EXPECT_EQ(ib[2], 3);
}

// A file as another writer makes it: keys in any order, __metadata__ anywhere, no padding.
TEST(Safetensors, ReadsWhatOtherWritersWrite) {
  float w[4] = {0.5f, 1.5f, -3.0f, 8.0f};
  double bias = -0.125;
  std::string data(reinterpret_cast<const char*>(&bias), 8);
  data += std::string(reinterpret_cast<const char*>(w), 16);
  std::string path = temp_path("other_writer.safetensors");
  write_bytes(path, file_of(R"({"weight":{"shape":[2,2],"dtype":"F32","data_offsets":[8,24]},)"
                            R"("__metadata__":{"format":"pt"},)"
                            R"("bias":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})",
                            data));
  opforge::SafetensorsFile f = opforge::load_safetensors(path);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.tensors.at("weight").shape(), (opforge::Shape{2, 2}));
  EXPECT_EQ(f.tensors.at("weight").to_double_vector(), (std::vector<double>{0.5, 1.5, -3, 8}));
  EXPECT_EQ(f.tensors.at("bias").dim(), 0);
  EXPECT_EQ(f.tensors.at("bias").item(), -0.125);
}

// A file PyTorch wrote with half-precision and small integer tensors
// (fixtures/make_narrow_dtypes.py) loads widened, every element equal to the exact value PyTorch
// stored beside it: signed zeros, subnormals, the largest finite values, infinities and NaN
// included.
TEST(Safetensors, NarrowDtypesFromPyTorchLoadWidenedExactly) {
  opforge::SafetensorsFile f =
      opforge::load_safetensors(std::string(OPFORGE_FIXTURES_DIR) + "/narrow_dtypes.safetensors");
  const std::map<std::string, std::pair<opforge::DType, std::string>> widened = {
      {"f16", {opforge::DType::Float32, "F16"}}, {"bf16", {opforge::DType::Float32, "BF16"}},
      {"i8", {opforge::DType::Int32, "I8"}},     {"u8", {opforge::DType::Int32, "U8"}},
      {"i16", {opforge::DType::Int32, "I16"}},   {"u16", {opforge::DType::Int32, "U16"}},
      {"u32", {opforge::DType::Int64, "U32"}}};
  EXPECT_EQ(f.stored_dtypes.size(), widened.size());
  for (const auto& [name, want] : widened) {
    SCOPED_TRACE(name);
    const opforge::Tensor& t = f.tensors.at(name);
    const opforge::Tensor& ref = f.tensors.at(name + ".ref");
    EXPECT_EQ(t.dtype(), want.first);
    EXPECT_EQ(f.stored_dtypes.at(name), want.second);
    EXPECT_EQ(f.stored_dtypes.count(name + ".ref"), 0u);  // F64 and I64 are read as they are
    ASSERT_EQ(t.shape(), ref.shape());
    std::vector<double> got = t.to_double_vector(), exact = ref.to_double_vector();
    for (size_t i = 0; i < got.size(); i++) {
      if (std::isnan(exact[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << i;
        continue;
      }
      EXPECT_EQ(got[i], exact[i]) << i;
      EXPECT_EQ(std::signbit(got[i]), std::signbit(exact[i])) << i;
    }
  }
  // The cases the fixture was made for are there: a float16 subnormal and 65504, a bfloat16
  // subnormal, uint32's largest value.
  const std::vector<double> f16 = f.tensors.at("f16").to_double_vector(),
                            bf16 = f.tensors.at("bf16").to_double_vector(),
                            u32 = f.tensors.at("u32").to_double_vector();
  EXPECT_EQ(f16[4], 65504.0);
  EXPECT_EQ(f16[7], std::ldexp(1.0, -24));
  EXPECT_EQ(bf16[6], std::ldexp(1.0, -133));
  EXPECT_EQ(u32[6], 4294967295.0);
}

// The widening by the format's bytes, without PyTorch: float16 0x0001 (2^-24), 0x7bff (65504),
// 0x8000 (-0), 0xfc00 (-inf), 0x7e00 (NaN), 0x3555 (0.33325195...); bfloat16 0x3f80 (1) and
// 0x0001 (2^-133).
TEST(Safetensors, HalfPrecisionBitsWidenAsTheFormatDefines) {
  const unsigned char f16[] = {0x01, 0x00, 0xff, 0x7b, 0x00, 0x80,
                               0x00, 0xfc, 0x00, 0x7e, 0x55, 0x35};
  const unsigned char bf16[] = {0x80, 0x3f, 0x01, 0x00};
  std::string path = temp_path("half.safetensors");
  write_bytes(path, file_of(R"({"h":{"dtype":"F16","shape":[6],"data_offsets":[0,12]},)"
                            R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[12,16]}})",
                            std::string(reinterpret_cast<const char*>(f16), 12) +
                                std::string(reinterpret_cast<const char*>(bf16), 4)));
  opforge::SafetensorsFile f = opforge::load_safetensors(path);
  std::vector<double> h = f.tensors.at("h").to_double_vector();
  EXPECT_EQ(h[0], std::ldexp(1.0, -24));
  EXPECT_EQ(h[1], 65504.0);
  EXPECT_TRUE(h[2] == 0.0 && std::signbit(h[2]));
  EXPECT_TRUE(std::isinf(h[3]) && h[3] < 0);
  EXPECT_TRUE(std::isnan(h[4]));
  EXPECT_EQ(h[5], 1365.0 / 4096.0);
  EXPECT_EQ(f.tensors.at("b").to_double_vector(),
            (std::vector<double>{1.0, std::ldexp(1.0, -133)}));
  // Written back, they are float32.
  std::string again = temp_path("half_again.safetensors");
  opforge::save_safetensors(again, f.tensors);
  EXPECT_EQ(opforge::load_safetensors(again).tensors.at("h").dtype(), opforge::DType::Float32);
}

TEST(Safetensors, BrokenFilesAreClearErrors) {
  std::string path = temp_path("broken.safetensors");
  auto load_error = [&](const std::string& bytes) {
    write_bytes(path, bytes);
    return error_message([&] { opforge::load_safetensors(path); });
  };
  const std::string ok = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NE(load_error("abc").find("too short"), std::string::npos);
  EXPECT_NE(load_error(std::string(8, '\xff')).find("runs past the file"), std::string::npos);
  EXPECT_NE(load_error(file_of("{not json", "")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(load_error(file_of("[1,2]", "")).find("not a JSON object"), std::string::npos);
  std::string m = load_error(file_of(
      R"({"x":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", std::string(2, '\0')));
  EXPECT_NE(m.find("dtype F8_E4M3"), std::string::npos) << m;
  m = load_error(  // two bytes an element, not four
      file_of(R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_NE(m.find("BF16 needs 4"), std::string::npos) << m;
  m = load_error(
      file_of(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_NE(m.find("needs 12"), std::string::npos) << m;
  m = load_error(file_of(ok, std::string(5, '\0')));  // truncated data
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  m = load_error(file_of(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("y":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         std::string(8, '\0')));
  EXPECT_NE(m.find("overlap"), std::string::npos) << m;
  m = load_error(
      file_of(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_NE(m.find("not a size"), std::string::npos) << m;
  m = load_error(file_of(R"({"x":{"dtype":"F32","data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_NE(m.find("has no shape"), std::string::npos) << m;
  m = error_message([&] { opforge::load_safetensors(temp_path("missing.safetensors")); });
  EXPECT_NE(m.find("cannot open"), std::string::npos) << m;
}

// A write that fails leaves the previous file whole.
TEST(Safetensors, AFailedSaveKeepsThePreviousFile) {
  std::string path = temp_path("kept.safetensors");
  Tensor a = random({3}, DType::Float32, Data::Normal, "st/kept");
  opforge::save_safetensors(path, {{"a", a}});
  std::string m = error_message([&] {
    opforge::save_safetensors(path, {{"a", a}, {"b", Tensor()}});
  });
  EXPECT_NE(m.find("'b' is undefined"), std::string::npos) << m;
  EXPECT_EQ(opforge::load_safetensors(path).tensors.at("a").to_double_vector(),
            a.to_double_vector());
  m = error_message([&] {
    opforge::save_safetensors(temp_path("no/such/dir/x.safetensors"), {{"a", a}});
  });
  EXPECT_NE(m.find("cannot write"), std::string::npos) << m;
}

}  // namespace
