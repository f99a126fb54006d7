// The one exception type of the library. Messages say what was wrong and what was expected:
// "add: cannot broadcast shapes [2, 3] and [4]".
#pragma once
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace opforge {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Raised when an allocation fails even after the allocator's cache was released.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
// Collects a message with operator<< and throws it as an Error when it goes out of scope.
class ErrorBuilder {
 public:
  ErrorBuilder() = default;
  ErrorBuilder(const ErrorBuilder&) = delete;
  template <class T>
  ErrorBuilder& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  [[noreturn]] ~ErrorBuilder() noexcept(false) { throw Error(os_.str()); }

 private:
  std::ostringstream os_;
};
}  // namespace detail

}  // namespace opforge

// OPFORGE_CHECK(cond) << "what was wrong and what was expected";
#define OPFORGE_CHECK(cond) \
  if (cond) {               \
  } else                    \
    ::opforge::detail::ErrorBuilder()

namespace opforge::detail {
// Shape arithmetic that refuses to overflow int64: `op` and `what` name the call and the quantity.
inline int64_t checked_add(const char* op, const char* what, int64_t a, int64_t b) {
  int64_t r;
  OPFORGE_CHECK(!__builtin_add_overflow(a, b, &r))
      << op << ": " << what << " overflows int64 (" << a << " + " << b << ")";
  return r;
}
inline int64_t checked_mul(const char* op, const char* what, int64_t a, int64_t b) {
  int64_t r;
  OPFORGE_CHECK(!__builtin_mul_overflow(a, b, &r))
      << op << ": " << what << " overflows int64 (" << a << " * " << b << ")";
  return r;
}
}  // namespace opforge::detail
