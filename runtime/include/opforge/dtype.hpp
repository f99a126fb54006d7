// Element types shared by the DSL, the generated registry and the runtime. No Halide here:
// users of the runtime include this without pulling in the compiler.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace opforge {

enum class DType : uint8_t { Bool, Int32, Int64, Float32, Float64 };

inline constexpr DType kAllDTypes[] = {DType::Bool, DType::Int32, DType::Int64, DType::Float32,
                                       DType::Float64};

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Bool:
      return "bool";
    case DType::Int32:
      return "int32";
    case DType::Int64:
      return "int64";
    case DType::Float32:
      return "float32";
    case DType::Float64:
      return "float64";
  }
  return "?";
}

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::Bool:
      return 1;
    case DType::Int32:
      return 4;
    case DType::Int64:
      return 8;
    case DType::Float32:
      return 4;
    case DType::Float64:
      return 8;
  }
  return 0;
}

constexpr bool is_floating(DType t) { return t == DType::Float32 || t == DType::Float64; }

// NumPy-style promotion along bool < int32 < int64 < float32 < float64.
constexpr DType promote(DType a, DType b) { return a > b ? a : b; }

// Parses "float32", "f32", "int64", ... ; returns false when the name is unknown.
bool parse_dtype(std::string_view name, DType& out);

template <class T>
struct dtype_of;
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::Bool;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::Int32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::Int64;
};
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::Float64;
};
template <class T>
inline constexpr DType dtype_of_v = dtype_of<T>::value;

}  // namespace opforge
