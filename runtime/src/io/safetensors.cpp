// The safetensors reader and writer (opforge/safetensors.hpp), with nlohmann::json for the header.
#include "opforge/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <vector>

#include "opforge/error.hpp"

namespace opforge {
namespace {
static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

// A header longer than this is refused rather than allocated (the reference reader caps it at
// 100 MB too).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// safetensors' dtype names, indexed by DType (Bool, Int32, Int64, Float32, Float64).
constexpr const char* kStDtypes[] = {"BOOL", "I32", "I64", "F32", "F64"};
static_assert(std::size(kStDtypes) == std::size(kAllDTypes));

const char* st_dtype(DType d) { return kStDtypes[size_t(d)]; }

// IEEE binary16 to binary32, exactly: subnormals become normal floats, infinities and NaNs keep
// their sign and payload.
float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    const float v = std::ldexp(float(mant), -24);  // zero or a subnormal: mant * 2^-24
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One stored element (little-endian) of a narrow dtype as the dtype that widens it.
template <class Stored>
Stored load_le(const unsigned char* p) {
  std::make_unsigned_t<Stored> u = 0;
  for (size_t k = 0; k < sizeof(Stored); k++) u |= std::make_unsigned_t<Stored>(p[k]) << (8 * k);
  return Stored(u);
}
float f16(const unsigned char* p) { return half_to_float(load_le<uint16_t>(p)); }
float bf16(const unsigned char* p) {
  return std::bit_cast<float>(uint32_t(load_le<uint16_t>(p)) << 16);
}
template <class Stored, class Wide>
Wide integer(const unsigned char* p) {
  return Wide(load_le<Stored>(p));
}

// raw's elements, `bytes` each, read by `read` into `out`'s (a dense tensor of T).
template <class T, T (*read)(const unsigned char*)>
void widen_as(const std::vector<unsigned char>& raw, int bytes, Tensor& out) {
  T* dst = static_cast<T*>(out.data());
  for (size_t i = 0; i < raw.size() / size_t(bytes); i++)
    dst[i] = read(raw.data() + i * size_t(bytes));
}

// How a stored dtype is read: opforge's own dtypes as they are (widen null); PyTorch's narrower
// ones widened to the opforge dtype that holds every value exactly (half precision to float32,
// small integers to int32, U32 to int64).
struct StoredDtype {
  DType dtype;       // what the tensor becomes
  int bytes;         // per stored element
  const char* name;  // the safetensors name
  void (*widen)(const std::vector<unsigned char>& raw, int bytes, Tensor& out) = nullptr;
};
constexpr StoredDtype kNarrow[] = {
    {DType::Float32, 2, "F16", widen_as<float, f16>},
    {DType::Float32, 2, "BF16", widen_as<float, bf16>},
    {DType::Int32, 1, "I8", widen_as<int32_t, integer<int8_t, int32_t>>},
    {DType::Int32, 1, "U8", widen_as<int32_t, integer<uint8_t, int32_t>>},
    {DType::Int32, 2, "I16", widen_as<int32_t, integer<int16_t, int32_t>>},
    {DType::Int32, 2, "U16", widen_as<int32_t, integer<uint16_t, int32_t>>},
    {DType::Int64, 4, "U32", widen_as<int64_t, integer<uint32_t, int64_t>>}};

StoredDtype from_st_dtype(const std::string& path, const std::string& name, const std::string& s) {
  for (DType d : kAllDTypes)
    if (s == st_dtype(d)) return {d, int(dtype_size(d)), st_dtype(d)};
  for (const StoredDtype& n : kNarrow)
    if (s == n.name) return n;
  OPFORGE_CHECK(false) << path << ": tensor '" << name << "' has dtype " << s
                       << ", which opforge cannot hold (expected BOOL, I32, I64, F32 or F64, or "
                          "F16, BF16, I8, U8, I16, U16, U32, read widened)";
  return {};
}

}  // namespace

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> dense;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    OPFORGE_CHECK(t.defined()) << "save_safetensors: tensor '" << name << "' is undefined";
    OPFORGE_CHECK(name != "__metadata__")
        << "save_safetensors: '__metadata__' is the header's reserved key, not a tensor name";
    Tensor c = t.to(Device{}).contiguous();
    uint64_t bytes = uint64_t(c.numel()) * c.element_size();
    header[name] = {{"dtype", st_dtype(c.dtype())},
                    {"shape", std::vector<int64_t>(c.shape().begin(), c.shape().end())},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    dense.push_back(std::move(c));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::filesystem::path target(path);
  const std::filesystem::path tmp = target.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    OPFORGE_CHECK(out.good()) << "save_safetensors: cannot write " << tmp.string() << ": "
                              << std::strerror(errno);
    uint64_t n = text.size();
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = uint8_t(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (const Tensor& c : dense)
      out.write(static_cast<const char*>(c.const_data()),
                std::streamsize(uint64_t(c.numel()) * c.element_size()));
    out.flush();
    if (!out.good()) {
      out.close();
      std::filesystem::remove(tmp);
      OPFORGE_CHECK(false) << "save_safetensors: writing " << path << " failed (disk full?)";
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, target, ec);
  if (ec) std::filesystem::remove(tmp);
  OPFORGE_CHECK(!ec) << "save_safetensors: cannot move " << tmp.string() << " to " << path << ": "
                     << ec.message();
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  OPFORGE_CHECK(in.good()) << "load_safetensors: cannot open " << path << ": "
                           << std::strerror(errno);
  in.seekg(0, std::ios::end);
  const uint64_t file_bytes = uint64_t(in.tellg());
  in.seekg(0);
  OPFORGE_CHECK(file_bytes >= 8) << path << ": " << file_bytes
                                 << " bytes, too short for a safetensors file (8-byte header "
                                    "length first)";
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++) n |= uint64_t(len[i]) << (8 * i);
  OPFORGE_CHECK(n <= kMaxHeaderBytes && n <= file_bytes - 8)
      << path << ": the header length " << n << " runs past the file's " << file_bytes
      << " bytes or the " << kMaxHeaderBytes << "-byte limit: not a safetensors file";
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    OPFORGE_CHECK(false) << path << ": the header is not valid JSON (" << e.what() << ")";
  }
  OPFORGE_CHECK(header.is_object()) << path << ": the header is not a JSON object";
  const uint64_t data_bytes = file_bytes - 8 - n;
  SafetensorsFile out;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      OPFORGE_CHECK(entry.is_object()) << path << ": __metadata__ is not an object";
      for (const auto& [k, v] : entry.items()) {
        OPFORGE_CHECK(v.is_string())
            << path << ": __metadata__ value '" << k << "' is not a string";
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    auto field = [&](const char* key) -> const nlohmann::json& {
      OPFORGE_CHECK(entry.is_object() && entry.contains(key))
          << path << ": tensor '" << name << "' has no " << key;
      return entry.at(key);
    };
    const auto& dt = field("dtype");
    OPFORGE_CHECK(dt.is_string()) << path << ": tensor '" << name << "': dtype is not a string";
    const StoredDtype stored = from_st_dtype(path, name, dt.get<std::string>());
    const auto& sh = field("shape");
    OPFORGE_CHECK(sh.is_array()) << path << ": tensor '" << name << "': shape is not a list";
    Shape shape;
    uint64_t elements = 1;
    for (const auto& d : sh) {
      OPFORGE_CHECK(d.is_number_unsigned() && d.get<uint64_t>() < (uint64_t(1) << 62))
          << path << ": tensor '" << name << "': shape " << sh.dump()
          << " has an entry that is not a size";
      shape.push_back(int64_t(d.get<uint64_t>()));
      OPFORGE_CHECK(!__builtin_mul_overflow(elements, d.get<uint64_t>(), &elements))
          << path << ": tensor '" << name << "': shape " << sh.dump() << " overflows";
    }
    const auto& off = field("data_offsets");
    OPFORGE_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                  off[1].is_number_unsigned())
        << path << ": tensor '" << name << "': data_offsets is not [begin, end]";
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    uint64_t bytes = 0;
    OPFORGE_CHECK(!__builtin_mul_overflow(elements, uint64_t(stored.bytes), &bytes) &&
                  begin <= end && end - begin == bytes)
        << path << ": tensor '" << name << "': data_offsets [" << begin << ", " << end << "] hold "
        << (end >= begin ? end - begin : 0) << " bytes, its shape " << sh.dump() << " of "
        << stored.name << " needs " << bytes;
    OPFORGE_CHECK(end <= data_bytes)
        << path << ": tensor '" << name << "' ends at byte " << end << " of the data, which has "
        << data_bytes << " (a truncated file?)";
    ranges.push_back({begin, end, name});
    Tensor t = Tensor::empty(shape, stored.dtype);
    const bool narrow = stored.widen != nullptr;
    std::vector<unsigned char> raw(narrow ? bytes : 0);
    if (bytes) {
      in.seekg(std::streamoff(8 + n + begin));
      in.read(narrow ? reinterpret_cast<char*>(raw.data()) : static_cast<char*>(t.data()),
              std::streamsize(bytes));
      OPFORGE_CHECK(in.good()) << path << ": reading tensor '" << name << "' failed";
    }
    if (narrow) {
      stored.widen(raw, stored.bytes, t);
      out.stored_dtypes[name] = stored.name;
    }
    out.tensors.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); i++)
    OPFORGE_CHECK(ranges[i].begin >= ranges[i - 1].end)
        << path << ": tensors '" << ranges[i - 1].name << "' and '" << ranges[i].name
        << "' overlap in the data";
  return out;
}

}  // namespace opforge
