// A vector of trivially copyable values that holds up to N of them inline: tensor shapes and
// strides, which the per-call path copies several times and which almost never exceed six dims,
// cost no heap allocation. Larger ones move to the heap. The interface is std::vector's subset
// that shape code uses; it converts to and from std::vector.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <new>
#include <type_traits>
#include <vector>

namespace opforge {

template <class T, size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T>, "SmallVector holds trivially copyable values");

 public:
  using value_type = T;
  using size_type = size_t;
  using iterator = T*;
  using const_iterator = const T*;
  using reverse_iterator = std::reverse_iterator<T*>;
  using const_reverse_iterator = std::reverse_iterator<const T*>;

  SmallVector() = default;
  explicit SmallVector(size_t n) { resize(n); }
  SmallVector(size_t n, const T& v) { resize(n, v); }
  SmallVector(std::initializer_list<T> v) { assign(v.begin(), v.end()); }
  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  SmallVector(It first, It last) {
    assign(first, last);
  }
  SmallVector(const std::vector<T>& v) { assign(v.begin(), v.end()); }  // NOLINT: implicit
  SmallVector(const SmallVector& o) { assign(o.begin(), o.end()); }
  SmallVector(SmallVector&& o) noexcept { take(o); }
  SmallVector& operator=(const SmallVector& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  SmallVector& operator=(SmallVector&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  SmallVector& operator=(std::initializer_list<T> v) {
    assign(v.begin(), v.end());
    return *this;
  }
  ~SmallVector() { release(); }
  operator std::vector<T>() const { return std::vector<T>(begin(), end()); }  // NOLINT: implicit

  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  void assign(It first, It last) {
    size_t n = size_t(std::distance(first, last));
    size_ = 0;
    reserve(n);
    std::copy(first, last, data_);
    size_ = n;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return cap_; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T& front() { return data_[0]; }
  const T& front() const { return data_[0]; }
  T& back() { return data_[size_ - 1]; }
  const T& back() const { return data_[size_ - 1]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  const T* cbegin() const { return data_; }
  const T* cend() const { return data_ + size_; }
  reverse_iterator rbegin() { return reverse_iterator(end()); }
  reverse_iterator rend() { return reverse_iterator(begin()); }
  const_reverse_iterator rbegin() const { return const_reverse_iterator(end()); }
  const_reverse_iterator rend() const { return const_reverse_iterator(begin()); }

  void reserve(size_t n) {
    if (n <= cap_) return;
    size_t cap = std::max(n, 2 * cap_);
    T* p = static_cast<T*>(::operator new(cap * sizeof(T)));
    if (size_) std::memcpy(p, data_, size_ * sizeof(T));
    release();
    data_ = p;
    cap_ = cap;
  }
  void resize(size_t n, const T& v = T()) {
    reserve(n);
    for (size_t i = size_; i < n; i++) data_[i] = v;
    size_ = n;
  }
  void clear() { size_ = 0; }
  void push_back(const T& v) {
    if (size_ == cap_) {
      T copy = v;  // v may live in this vector
      reserve(size_ + 1);
      data_[size_++] = copy;
      return;
    }
    data_[size_++] = v;
  }
  template <class... A>
  T& emplace_back(A&&... a) {
    push_back(T(std::forward<A>(a)...));
    return back();
  }
  void pop_back() { size_--; }
  T* insert(const T* pos, const T& v) { return insert(pos, &v, &v + 1); }
  template <class It, class = typename std::iterator_traits<It>::iterator_category>
  T* insert(const T* pos, It first, It last) {
    size_t at = size_t(pos - data_), n = size_t(std::distance(first, last));
    SmallVector tail(data_ + at, data_ + size_);  // first..last may point into this vector
    SmallVector mid(first, last);
    reserve(size_ + n);
    std::copy(mid.begin(), mid.end(), data_ + at);
    std::copy(tail.begin(), tail.end(), data_ + at + n);
    size_ += n;
    return data_ + at;
  }
  T* insert(const T* pos, std::initializer_list<T> v) { return insert(pos, v.begin(), v.end()); }
  void assign(size_t n, const T& v) {
    size_ = 0;
    resize(n, v);
  }
  T* erase(const T* pos) { return erase(pos, pos + 1); }
  T* erase(const T* first, const T* last) {
    size_t at = size_t(first - data_), n = size_t(last - first);
    std::memmove(data_ + at, data_ + at + n, (size_ - at - n) * sizeof(T));
    size_ -= n;
    return data_ + at;
  }

  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const SmallVector& a, const SmallVector& b) { return !(a == b); }
  friend bool operator<(const SmallVector& a, const SmallVector& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  void release() {
    if (data_ != inline_) ::operator delete(data_);
    data_ = inline_;
    cap_ = N;
  }
  void take(SmallVector& o) {
    if (o.data_ == o.inline_) {
      std::memcpy(inline_, o.inline_, o.size_ * sizeof(T));
      data_ = inline_;
      cap_ = N;
    } else {
      data_ = o.data_;
      cap_ = o.cap_;
      o.data_ = o.inline_;
      o.cap_ = N;
    }
    size_ = o.size_;
    o.size_ = 0;
  }
  T inline_[N];
  T* data_ = inline_;
  size_t size_ = 0, cap_ = N;
};

}  // namespace opforge
