// A set of variant indices of one kernel group: the variants a call may run, and with its shape
// bucket what the placement model keys a measurement by. The first 64 variants are one word held
// inline; a group that grows past 64 (kernels registered at run time) takes more words on the
// heap. There is no limit on the number of variants. The sets of the built-in groups (a dozen
// variants or so) never touch the heap part: copying, comparing or hashing one costs about what a
// 64-bit mask did, which matters, as every call builds several (the per-call path).
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace opforge {

class VariantSet {
 public:
  VariantSet() = default;
  // Variants 0-63 as the bits of a word (bit i: variant i).
  VariantSet(uint64_t first_64) : low_(first_64) {}
  VariantSet(const VariantSet& o) : low_(o.low_) {
    if (o.high_) high_ = std::make_unique<Words>(*o.high_);
  }
  VariantSet(VariantSet&&) noexcept = default;
  VariantSet& operator=(const VariantSet& o) {
    low_ = o.low_;
    if (o.high_)
      high_ = std::make_unique<Words>(*o.high_);
    else
      high_.reset();
    return *this;
  }
  VariantSet& operator=(VariantSet&&) noexcept = default;

  void insert(size_t i) {
    if (i < 64) {
      low_ |= uint64_t(1) << i;
      return;
    }
    size_t w = i / 64 - 1;
    if (!high_) high_ = std::make_unique<Words>();
    if (high_->size() <= w) high_->resize(w + 1, 0);
    (*high_)[w] |= uint64_t(1) << (i % 64);
  }
  void erase(size_t i) {
    if (i < 64) {
      low_ &= ~(uint64_t(1) << i);
      return;
    }
    size_t w = i / 64 - 1;
    if (!high_ || w >= high_->size()) return;
    (*high_)[w] &= ~(uint64_t(1) << (i % 64));
    trim();
  }
  bool contains(size_t i) const {
    if (i < 64) return (low_ >> i) & 1;
    size_t w = i / 64 - 1;
    return high_ && w < high_->size() && (((*high_)[w] >> (i % 64)) & 1);
  }
  // The heap part is null or ends in a non-zero word, so a set with one is never empty.
  bool empty() const { return low_ == 0 && !high_; }
  // The smallest index in the set; -1 when it is empty.
  int first() const {
    if (low_) return std::countr_zero(low_);
    if (high_)
      for (size_t w = 0; w < high_->size(); w++)
        if ((*high_)[w]) return int(64 * (w + 1)) + std::countr_zero((*high_)[w]);
    return -1;
  }
  // Calls f(index) for each index, in increasing order.
  template <class F>
  void for_each(F&& f) const {
    for_word(low_, 0, f);
    if (high_)
      for (size_t w = 0; w < high_->size(); w++) for_word((*high_)[w], 64 * (w + 1), f);
  }

  VariantSet& operator&=(const VariantSet& o) {
    low_ &= o.low_;
    if (high_) {
      for (size_t w = 0; w < high_->size(); w++)
        (*high_)[w] &= o.high_ && w < o.high_->size() ? (*o.high_)[w] : 0;
      trim();
    }
    return *this;
  }
  friend VariantSet operator&(VariantSet a, const VariantSet& b) {
    a &= b;
    return a;
  }
  bool operator==(const VariantSet& o) const {
    return low_ == o.low_ && (high_ ? o.high_ && *high_ == *o.high_ : !o.high_);
  }
  size_t hash() const {
    uint64_t h = low_ * 0x9E3779B97F4A7C15ull;
    if (high_)
      for (uint64_t w : *high_) h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    return size_t(h);
  }

 private:
  using Words = std::vector<uint64_t>;  // variants 64 and above, 64 a word
  template <class F>
  static void for_word(uint64_t bits, size_t base, F& f) {
    while (bits) {
      f(int(base) + std::countr_zero(bits));
      bits &= bits - 1;
    }
  }
  void trim() {
    while (!high_->empty() && high_->back() == 0) high_->pop_back();
    if (high_->empty()) high_.reset();
  }
  uint64_t low_ = 0;
  std::unique_ptr<Words> high_;
};

}  // namespace opforge
