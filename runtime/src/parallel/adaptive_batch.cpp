#include "opforge/adaptive_batch.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "opforge/error.hpp"

namespace opforge {

AdaptiveBatchSize::AdaptiveBatchSize(int64_t start, Options options)
    : o_(options), batch_(start), skip_(options.warmup) {
  OPFORGE_CHECK(o_.min > 0 && o_.min <= o_.max && o_.multiple > 0)
      << "batch size bounds " << o_.min << ".." << o_.max << " in multiples of " << o_.multiple
      << ": expected 0 < min <= max and a positive multiple";
  const int64_t lo = (o_.min + o_.multiple - 1) / o_.multiple * o_.multiple,
                hi = o_.max / o_.multiple * o_.multiple;
  OPFORGE_CHECK(lo <= hi) << "no multiple of " << o_.multiple << " between the batch bounds "
                          << o_.min << " and " << o_.max;
  o_.min = lo;
  o_.max = hi;
  OPFORGE_CHECK(start >= o_.min && start <= o_.max && start % o_.multiple == 0)
      << "a starting batch of " << start << " outside the bounds " << o_.min << ".." << o_.max
      << " or not a multiple of " << o_.multiple;
  OPFORGE_CHECK(o_.window > 0 && o_.warmup >= 0 && o_.window_seconds >= 0 && o_.settle >= 0 &&
                o_.gain >= 0 && o_.load_drop > 0 && o_.load_drop < 1 && o_.load_windows > 0)
      << "AdaptiveBatchSize: window and load_windows must be positive, warmup, window_seconds, "
         "settle and gain >= 0, load_drop in (0, 1)";
}

std::optional<AdaptiveBatchSize::Change> AdaptiveBatchSize::change_to(int64_t to, std::string why) {
  to = std::max(o_.min, std::clamp(to, o_.min, o_.max) / o_.multiple * o_.multiple);
  if (to == batch_) return std::nullopt;
  Change c{step_, batch_, to, std::move(why)};
  batch_ = to;
  changed_at_ = step_;
  skip_ = o_.warmup;
  steps_ = samples_ = low_windows_ = 0;
  short_in_window_ = false;
  seconds_ = 0;
  settled_rate_ = 0;
  return c;
}

std::optional<AdaptiveBatchSize::Change> AdaptiveBatchSize::record(int64_t samples, double seconds,
                                                                   bool memory_pressure) {
  step_++;
  short_in_window_ = short_in_window_ || memory_pressure;
  // A window's steps at a batch first: the devices' micro-batches may shrink to fit meanwhile.
  if (memory_pressure && step_ - changed_at_ > o_.warmup + o_.window) {
    // Memory first: halve now, and grow no more past the batch that ran short.
    probing_ = false;
    cap_ = std::max(o_.min, batch_ / 2);
    settled_since_ = step_;
    return change_to(batch_ / 2, "memory ran short at batch " + std::to_string(batch_));
  }
  if (skip_ > 0) {
    skip_--;
    return std::nullopt;
  }
  if (samples <= 0 || !std::isfinite(seconds) || seconds <= 0) return std::nullopt;
  steps_++;
  samples_ += samples;
  seconds_ += seconds;
  if (steps_ < o_.window || seconds_ < o_.window_seconds) return std::nullopt;
  const double rate = double(samples_) / seconds_;
  const bool had_room = !short_in_window_;
  steps_ = samples_ = 0;
  seconds_ = 0;
  short_in_window_ = false;
  auto rate_text = [](double r) {
    std::ostringstream os;
    os.precision(0);
    os << std::fixed << r << " samples/s";
    return os.str();
  };
  if (probing_) {
    probing_ = false;
    if (rate < before_rate_ * (1 + o_.gain)) {
      settled_since_ = step_;
      const int64_t back = before_;
      auto c =
          change_to(back, "batch " + std::to_string(batch_) + " gave " + rate_text(rate) +
                              ", batch " + std::to_string(back) + " " + rate_text(before_rate_));
      settled_rate_ = before_rate_;
      return c;
    }
  }
  if (settled_rate_ > 0 && rate < settled_rate_ * (1 - o_.load_drop)) {
    // One slow measurement may be noise; a low one does not move the usual rate.
    if (++low_windows_ < o_.load_windows) return std::nullopt;
    settled_since_ = step_;
    return change_to(batch_ / 2, "throughput fell from " + rate_text(settled_rate_) + " to " +
                                     rate_text(rate) + ": a device is under load");
  }
  low_windows_ = 0;
  settled_rate_ = settled_rate_ == 0 ? rate : (settled_rate_ + rate) / 2;
  if (cap_ > 0 && step_ - settled_since_ >= o_.settle) cap_ = 0;  // memory may have come back
  const int64_t limit = cap_ > 0 ? std::min(cap_, o_.max) : o_.max;
  const bool may_grow = settled_since_ == 0 || step_ - settled_since_ >= o_.settle;
  if (may_grow && had_room && batch_ < limit) {
    probing_ = true;
    before_ = batch_;
    before_rate_ = rate;
    return change_to(std::min(batch_ * 2, limit), "trying a larger batch (" + rate_text(rate) +
                                                      " at " + std::to_string(batch_) + ")");
  }
  return std::nullopt;
}

}  // namespace opforge
