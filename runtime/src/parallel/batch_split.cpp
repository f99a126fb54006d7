#include "opforge/batch_split.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "opforge/error.hpp"

namespace opforge {

ThroughputSplit::ThroughputSplit(std::vector<double> initial_rates)
    : ThroughputSplit(std::move(initial_rates), Options{}) {}

ThroughputSplit::ThroughputSplit(std::vector<double> initial_rates, Options options)
    : rates_(std::move(initial_rates)),
      per_sample_(rates_.size(), 0),
      measured_(rates_.size(), false),
      options_(options) {
  OPFORGE_CHECK(!rates_.empty()) << "ThroughputSplit: no devices to split among";
  for (size_t i = 0; i < rates_.size(); i++)
    OPFORGE_CHECK(std::isfinite(rates_[i]) && rates_[i] > 0)
        << "ThroughputSplit: device " << i << "'s initial throughput is " << rates_[i]
        << ", expected a positive number";
  OPFORGE_CHECK(options_.smoothing > 0 && options_.smoothing <= 1)
      << "ThroughputSplit: smoothing " << options_.smoothing << " is not in (0, 1]";
  OPFORGE_CHECK(options_.hysteresis >= 0 && std::isfinite(options_.hysteresis))
      << "ThroughputSplit: hysteresis " << options_.hysteresis << " is not a fraction >= 0";
}

std::vector<double> ThroughputSplit::fractions() const {
  double total = std::accumulate(rates_.begin(), rates_.end(), 0.0);
  std::vector<double> f(rates_.size());
  for (size_t i = 0; i < f.size(); i++) f[i] = rates_[i] / total;
  return f;
}

std::vector<int64_t> ThroughputSplit::proportional(int64_t batch) const {
  const size_t n = rates_.size();
  std::vector<int64_t> out(n, 0);
  if (batch < int64_t(n)) {  // one sample each for the fastest
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return rates_[a] > rates_[b]; });
    for (int64_t k = 0; k < batch; k++) out[order[size_t(k)]] = 1;
    return out;
  }
  // Largest remainders, every device at least one sample.
  std::vector<double> ideal = fractions();
  int64_t given = 0;
  for (size_t i = 0; i < n; i++) {
    ideal[i] *= double(batch);
    out[i] = std::max<int64_t>(1, int64_t(std::floor(ideal[i])));
    given += out[i];
  }
  for (; given < batch; given++) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
      if (ideal[i] - double(out[i]) > ideal[best] - double(out[best])) best = i;
    out[best]++;
  }
  for (; given > batch; given--) {  // a device raised to one sample took it from the others
    size_t worst = n;
    for (size_t i = 0; i < n; i++)
      if (out[i] > 1 &&
          (worst == n || ideal[i] - double(out[i]) < ideal[worst] - double(out[worst])))
        worst = i;
    out[worst]--;
  }
  return out;
}

double ThroughputSplit::predicted_seconds(const std::vector<int64_t>& samples) const {
  double worst = 0;
  for (size_t i = 0; i < samples.size(); i++)
    worst = std::max(worst, double(samples[i]) / rates_[i]);
  return worst;
}

std::vector<int64_t> ThroughputSplit::plan(int64_t batch) const {
  OPFORGE_CHECK(batch >= 0) << "ThroughputSplit: a batch of " << batch << " samples";
  return proportional(batch);
}

std::vector<int64_t> ThroughputSplit::split(int64_t batch) {
  OPFORGE_CHECK(batch >= 0) << "ThroughputSplit: a batch of " << batch << " samples";
  std::vector<int64_t> next = proportional(batch);
  if (options_.fixed) return next;
  bool same_batch = current_.size() == next.size() &&
                    std::accumulate(current_.begin(), current_.end(), int64_t{0}) == batch;
  if (!same_batch ||
      predicted_seconds(next) * (1 + options_.hysteresis) < predicted_seconds(current_))
    current_ = std::move(next);
  return current_;
}

void ThroughputSplit::drop(size_t i) {
  OPFORGE_CHECK(i < rates_.size() && rates_.size() > 1)
      << "ThroughputSplit::drop: device " << i << " of " << rates_.size()
      << " (the last device cannot leave)";
  const auto at = std::ptrdiff_t(i);
  rates_.erase(rates_.begin() + at);
  per_sample_.erase(per_sample_.begin() + at);
  measured_.erase(measured_.begin() + at);
  current_.clear();
}

void ThroughputSplit::add(size_t at, double rate) {
  OPFORGE_CHECK(at <= rates_.size())
      << "ThroughputSplit::add: position " << at << " of " << rates_.size() << " devices";
  OPFORGE_CHECK(std::isfinite(rate) && rate > 0)
      << "ThroughputSplit::add: a throughput of " << rate << ", expected a positive number";
  const auto pos = std::ptrdiff_t(at);
  rates_.insert(rates_.begin() + pos, rate);
  per_sample_.insert(per_sample_.begin() + pos, 0);
  measured_.insert(measured_.begin() + pos, false);
  current_.clear();
}

void ThroughputSplit::record(const std::vector<int64_t>& samples,
                             const std::vector<double>& seconds) {
  OPFORGE_CHECK(samples.size() == rates_.size() && seconds.size() == rates_.size())
      << "ThroughputSplit::record: " << samples.size() << " sample counts and " << seconds.size()
      << " times for " << rates_.size() << " devices";
  if (options_.fixed) return;
  // A device measured for the first time replaces its initial guess; devices still unmeasured
  // (given no sample yet) have their guesses brought to the same unit, samples per second.
  double scale_sum = 0;
  int newly = 0;
  for (size_t i = 0; i < rates_.size(); i++) {
    if (samples[i] <= 0 || !std::isfinite(seconds[i]) || seconds[i] <= 0) continue;
    double r = double(samples[i]) / seconds[i], x = 1 / r;
    if (measured_[i]) {
      // Averaged as seconds per sample, not samples per second: the mean of n / t overestimates
      // a noisy device's rate (another process takes its core now and then), which would then
      // get too large a share and end most steps last.
      per_sample_[i] += options_.smoothing * (x - per_sample_[i]);
    } else {
      scale_sum += r / rates_[i];
      newly++;
      per_sample_[i] = x;
      measured_[i] = true;
    }
    rates_[i] = 1 / per_sample_[i];
  }
  if (newly == 0) return;
  for (size_t i = 0; i < rates_.size(); i++)
    if (!measured_[i]) rates_[i] *= scale_sum / newly;
}

}  // namespace opforge
