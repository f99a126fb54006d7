// DataParallel: the batch split by measured throughput, a thread per device, gradients summed in
// device order.
#include "opforge/torch/parallel.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <iostream>
#include <sstream>

#include "opforge/autograd.hpp"
#include "share_state.hpp"
#include "share_threads.hpp"

namespace opforge::torch::nn {
namespace {
// Where shares start: CPU devices by their cores, other devices as the largest CPU device.
std::vector<double> initial_rates(const std::vector<Device>& devs) {
  OPFORGE_CHECK(!devs.empty()) << "DataParallel: no devices given";
  std::vector<double> rates(devs.size(), 0);
  double largest_cpu = 1;
  for (size_t i = 0; i < devs.size(); i++)
    for (const DeviceInfo& info : opforge::devices())
      if (info.device == devs[i] && devs[i].kind == DeviceKind::cpu) {
        rates[i] = std::max(1, info.cores);
        largest_cpu = std::max(largest_cpu, rates[i]);
      }
  for (double& r : rates)
    if (r == 0) r = largest_cpu;
  return rates;
}

// A layer whose training-mode forward changes buffers of its own, which the shares' threads would
// do at once (BatchNorm2d updates its running statistics through share_state.hpp instead).
const Module* shared_state(const Module& m) {
  if (m.is_training() && !m.named_buffers(false).empty() && !dynamic_cast<const BatchNorm2d*>(&m))
    return &m;
  for (const auto& [name, child] : m.named_children())
    if (const Module* found = shared_state(*child)) return found;
  return nullptr;
}

// This step's seed for each training-mode Dropout, drawn from its generator here on the caller's
// thread, in the module tree's order, so a run is reproducible.
void draw_dropout_seeds(Module& m, std::map<const Module*, uint64_t>& seeds) {
  if (auto* d = dynamic_cast<Dropout*>(&m); d && d->is_training())
    seeds[d] = d->generator().engine()();
  for (const auto& [name, child] : m.named_children()) draw_dropout_seeds(*child, seeds);
}

// The calling thread runs rows of a share (from first_sample on) while it lives.
class InShare {
 public:
  InShare(ShareState& state) : before_(current_share()) { current_share() = &state; }
  ~InShare() { current_share() = before_; }
  InShare(const InShare&) = delete;
  InShare& operator=(const InShare&) = delete;

 private:
  ShareState* before_;
};

// Each BatchNorm2d's running statistics updated once from every part of the batch it saw, the
// parts in device order.
void update_batch_norms(const std::vector<std::vector<ShareState::Stats>>& per_device) {
  std::vector<BatchNorm2d*> order;
  std::map<BatchNorm2d*, std::vector<BatchNorm2d::RowStats>> parts;
  for (const auto& stats : per_device)
    for (const ShareState::Stats& s : stats) {
      auto& list = parts[s.module];
      if (list.empty()) order.push_back(s.module);
      list.push_back(s.rows);
    }
  for (BatchNorm2d* m : order) m->update_running_stats(parts[m]);
}

// Where each device's share starts in the batch.
std::vector<int64_t> offsets(const std::vector<int64_t>& split) {
  std::vector<int64_t> begin(split.size(), 0);
  for (size_t i = 1; i < split.size(); i++) begin[i] = begin[i - 1] + split[i - 1];
  return begin;
}

// Runs body(i, begin, count) for each device's share, device 0's on the calling thread and the
// others on `threads`, each pinned to its device; returns each one's error (null where it
// succeeded).
template <class Body>
std::vector<std::exception_ptr> run_shares(ShareThreads& threads, const std::vector<Device>& devs,
                                           const std::vector<int64_t>& split, Body body) {
  std::vector<std::exception_ptr> errors(devs.size());
  const std::vector<int64_t> begin = offsets(split);
  auto run = [&](size_t i) {
    if (split[i] == 0) return;
    try {
      DefaultDevice on(devs[i]);
      body(i, begin[i], split[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  threads.run(devs.size(), run);
  return errors;
}

std::string what_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown exception";
  }
}

// Raises a share's error as an Error (an OutOfMemoryError if it was one) naming the device.
[[noreturn]] void raise(const Device& d, int64_t samples, const std::exception_ptr& error,
                        const std::string& more = "") {
  std::ostringstream msg;
  msg << "DataParallel: the share of " << d.str() << " (" << samples << " samples) failed" << more
      << ": " << what_of(error);
  try {
    std::rethrow_exception(error);
  } catch (const OutOfMemoryError&) {
    throw OutOfMemoryError(msg.str());
  } catch (...) {
  }
  throw Error(msg.str());
}
}  // namespace

DataParallel::DataParallel(std::shared_ptr<Module> module, std::vector<Device> devices,
                           ThroughputSplit::Options options)
    : module_(std::move(module)),
      devices_(std::move(devices)),
      split_(initial_rates(devices_), options),
      micro_(devices_.size()),
      waits_(devices_.size(), 0),
      initial_rates_(split_.rates()),
      fixed_split_(options.fixed) {
  OPFORGE_CHECK(module_) << "DataParallel: the module is null";
  threads_ = std::make_shared<ShareThreads>();
  for (size_t i = 0; i < devices_.size(); i++) places_.push_back(i);
  for (size_t i = 0; i < devices_.size(); i++) {
    OPFORGE_CHECK(device_exists(devices_[i]))
        << "DataParallel: no device " << devices_[i].str() << " on this machine";
    for (size_t j = 0; j < i; j++)
      OPFORGE_CHECK(!(devices_[j] == devices_[i]))
          << "DataParallel: " << devices_[i].str() << " is given twice";
  }
}

void DataParallel::MicroBatch::after_step(int64_t share, bool ran_out) {
  if (ran_out) {
    // Out of memory right after growing: wait twice as long before the next try.
    if (grew) wait = std::min(wait * 2, 1024);
    grew = false;
    calm = 0;
    return;
  }
  grew = false;
  if (size == 0) return;
  if (size >= share) {  // the share itself shrank to fit
    size = 0;
    return;
  }
  if (++calm < wait) return;
  calm = 0;
  size *= 2;
  grew = true;
  if (size >= share) size = 0;
}

void DataParallel::drop(size_t i, const std::string& why) {
  std::ostringstream warning;
  warning << "opforge: warning: DataParallel: " << devices_[i].str() << " failed (" << why
          << ") and leaves the split; the run goes on over";
  for (size_t k = 0, listed = 0; k < devices_.size(); k++)
    if (k != i) warning << (listed++ ? ", " : " ") << devices_[k].str();
  std::cerr << warning.str() << std::endl;
  dropped_.push_back({devices_[i], why});
  int64_t& wait = waits_[places_[i]];
  wait = wait == 0 ? rejoin_after_ : std::min<int64_t>(wait * 2, int64_t(1) << 20);
  away_.push_back({places_[i], steps_, steps_ + wait, split_.rates()[i]});
  places_.erase(places_.begin() + std::ptrdiff_t(i));
  devices_.erase(devices_.begin() + std::ptrdiff_t(i));
  micro_.erase(micro_.begin() + std::ptrdiff_t(i));
  last_split_.erase(last_split_.begin() + std::ptrdiff_t(i));
  last_seconds_.erase(last_seconds_.begin() + std::ptrdiff_t(i));
  split_.drop(i);
}

void DataParallel::rejoin_after(int64_t steps) {
  OPFORGE_CHECK(steps >= 0) << "DataParallel: rejoin_after(" << steps
                            << "), expected a number of steps >= 0 (0: never)";
  rejoin_after_ = steps;
  for (size_t k = 0; k < away_.size(); k++) {
    waits_[away_[k].place] = steps;
    away_[k].back_after = away_[k].left_at + steps;
  }
}

void DataParallel::rejoin() {
  for (size_t k = 0; k < away_.size();) {
    const Away a = away_[k];
    const Device d = dropped_[k].first;
    if (rejoin_after_ == 0 || steps_ <= a.back_after || !device_exists(d)) {
      k++;
      continue;
    }
    // Back at its place in the device order (the order gradients are summed in), planned at
    // the smallest rate until its first step measures it (the static split: its own).
    const size_t at = size_t(
        std::count_if(places_.begin(), places_.end(), [&](size_t p) { return p < a.place; }));
    const std::vector<double>& rates = split_.rates();
    split_.add(at, fixed_split_ ? initial_rates_[a.place]
                                : std::min(a.rate, *std::min_element(rates.begin(), rates.end())));
    const auto pos = std::ptrdiff_t(at);
    if (last_split_.size() == devices_.size()) {
      last_split_.insert(last_split_.begin() + pos, 0);
      last_seconds_.insert(last_seconds_.begin() + pos, 0.0);
    }
    devices_.insert(devices_.begin() + pos, d);
    places_.insert(places_.begin() + pos, a.place);
    micro_.insert(micro_.begin() + pos, MicroBatch{});
    dropped_.erase(dropped_.begin() + std::ptrdiff_t(k));
    away_.erase(away_.begin() + std::ptrdiff_t(k));
    std::cerr << "opforge: DataParallel: " << d.str() << " returns to the split after "
              << steps_ - a.left_at - 1 << " steps away" << std::endl;
  }
}

std::vector<int64_t> DataParallel::micro_batch_sizes() const {
  std::vector<int64_t> out;
  for (const MicroBatch& m : micro_) out.push_back(m.size);
  return out;
}

void DataParallel::check_module() const {
  if (const Module* m = shared_state(*module_))
    throw Error("DataParallel: the module has a " + m->name() +
                " layer in training mode with buffers of its own, which every device's share "
                "would change at once; DataParallel trains modules whose only such layers are "
                "Dropout and BatchNorm2d, or evaluates any module (eval())");
}

Tensor DataParallel::forward_backward(const Tensor& input, const Tensor& target,
                                      const Criterion& criterion) {
  OPFORGE_CHECK(input.defined() && target.defined() && input.dim() >= 1 && target.dim() >= 1)
      << "DataParallel: input and target must be tensors with a batch dimension";
  const int64_t batch = input.size(0);
  OPFORGE_CHECK(target.size(0) == batch)
      << "DataParallel: the input has " << batch << " samples, the target " << target.size(0);
  OPFORGE_CHECK(batch > 0) << "DataParallel: an empty batch";
  check_module();
  steps_++;
  rejoin();
  const std::vector<Tensor> params = [&] {
    std::vector<Tensor> p;
    for (const Tensor& t : module_->parameters())
      if (t.requires_grad()) p.push_back(t);
    return p;
  }();
  const size_t n = devices_.size();
  std::vector<int64_t> split = split_.split(batch);
  std::vector<std::vector<Tensor>> grads(n);
  std::vector<Tensor> losses(n);
  std::vector<std::vector<ShareState::Stats>> norm_stats(n);
  std::map<const Module*, uint64_t> dropout_seeds;
  draw_dropout_seeds(*module_, dropout_seeds);
  std::vector<double> seconds(n, 0);
  std::vector<char> short_of_memory(n, 0);  // each share's thread writes its own
  // Share i's passes on the calling thread's device (its own, or another that takes over a
  // failed share), with device `on`'s micro-batch size.
  auto share = [&](size_t i, int64_t begin, int64_t count, size_t on) {
    auto start = std::chrono::steady_clock::now();
    autograd::GradModeGuard grad_on(true);
    // A micro-batch's gradients, added to the share's only once all of them are there: one that
    // runs out of memory halfway is run again, smaller, and must not count twice.
    auto micro_batch = [&](int64_t at, int64_t m) {
      ShareState state(at, &dropout_seeds);
      InShare in_share(state);
      Tensor out = (*module_)(input.slice(0, at, at + m));
      Tensor loss = criterion(out, target.slice(0, at, at + m));
      OPFORGE_CHECK(loss.numel() == 1) << "the criterion gave a loss of shape "
                                       << shape_str(loss.shape()) << ", expected a single value";
      loss = mul(loss, double(m) / double(batch));
      std::vector<Tensor> g;
      if (!params.empty()) g = autograd::grad({loss}, params, {}, false, true);
      if (!grads[i].empty())
        for (size_t j = 0; j < g.size(); j++)
          if (grads[i][j].defined()) g[j] = g[j].defined() ? add(grads[i][j], g[j]) : grads[i][j];
      for (const Tensor& t : g)
        if (t.defined()) t.wait();
      loss = loss.detach();
      if (losses[i].defined()) loss = add(losses[i], loss);
      loss.wait();
      grads[i] = std::move(g);
      losses[i] = std::move(loss);
      for (ShareState::Stats& st : state.batch_stats) norm_stats[i].push_back(std::move(st));
    };
    MicroBatch& mb = micro_[on];
    bool ran_out = false;
    for (int64_t done = 0; done < count;) {
      const int64_t m = mb.size > 0 ? std::min(mb.size, count - done) : count - done;
      try {
        micro_batch(begin + done, m);
      } catch (const OutOfMemoryError&) {
        if (m == 1) throw;  // not even one sample fits
        mb.size = (m + 1) / 2;
        ran_out = true;
        short_of_memory[i] = 1;
        continue;
      }
      done += m;
    }
    if (on == i) {  // a share run for another device is not its own
      mb.after_step(count, ran_out);
      seconds[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  };
  std::vector<std::exception_ptr> errors =
      run_shares(*threads_, devices_, split,
                 [&](size_t i, int64_t begin, int64_t count) { share(i, begin, count, i); });
  // A failed share runs again on the first device that succeeded: if it passes there, its own
  // device was at fault and leaves the split (below); if not, the error is the step's own (the
  // data, the module, the criterion) and is raised, no gradient added.
  std::vector<size_t> failed;
  size_t healthy = n;
  for (size_t i = 0; i < n; i++) {
    if (errors[i])
      failed.push_back(i);
    else if (healthy == n && split[i] > 0)
      healthy = i;
  }
  for (size_t i : failed) {
    if (healthy == n) raise(devices_[i], split[i], errors[i]);
    grads[i].clear();
    losses[i] = Tensor();
    norm_stats[i].clear();
    try {
      DefaultDevice on(devices_[healthy]);
      share(i, offsets(split)[i], split[i], healthy);
    } catch (...) {
      std::ostringstream again;
      again << " (and again on " << devices_[healthy].str() << ", so not for the device's sake)";
      raise(devices_[i], split[i], errors[i], again.str());
    }
  }
  split_.record(split, seconds);
  last_split_ = split;
  for (size_t i : failed) {  // what each device ran
    last_split_[healthy] += split[i];
    last_split_[i] = 0;
  }
  last_seconds_ = seconds;
  ran_out_ = std::find(short_of_memory.begin(), short_of_memory.end(), 1) != short_of_memory.end();
  update_batch_norms(norm_stats);

  // The gradients' sum, in device order. Issued from this thread, its calls are queued where
  // placement finds room (the least loaded device first): summing on every device's thread at
  // once, each its part of the rows, measured slower (the loaded device's part waited).
  autograd::NoGradGuard no_grad;
  for (size_t j = 0; j < params.size(); j++) {
    Tensor total;
    for (size_t i = 0; i < n; i++) {
      if (grads[i].empty() || !grads[i][j].defined()) continue;
      Tensor g = grads[i][j].to(params[j].device());
      total = total.defined() ? add(total, g) : g;
    }
    if (!total.defined()) continue;
    Tensor param = params[j], slot = param.grad();
    if (slot.defined())
      slot.add_(total);
    else
      param.set_grad(total.is_contiguous() ? total : total.contiguous());
  }
  Tensor loss;
  for (const Tensor& l : losses)
    if (l.defined()) loss = loss.defined() ? add(loss, l.cpu()) : l.cpu();
  for (auto it = failed.rbegin(); it != failed.rend(); ++it) drop(*it, what_of(errors[*it]));
  return loss;
}

Tensor DataParallel::forward(const Tensor& input) {
  OPFORGE_CHECK(input.defined() && input.dim() >= 1)
      << "DataParallel: the input must be a tensor with a batch dimension";
  check_module();
  const int64_t batch = input.size(0);
  OPFORGE_CHECK(batch > 0) << "DataParallel: an empty batch";
  std::vector<int64_t> split = split_.plan(batch);  // training's split keeps its state
  std::vector<Tensor> outs(devices_.size());
  std::vector<std::vector<ShareState::Stats>> norm_stats(devices_.size());
  std::map<const Module*, uint64_t> dropout_seeds;
  draw_dropout_seeds(*module_, dropout_seeds);
  const bool grad_mode = autograd::grad_enabled();
  std::vector<std::exception_ptr> errors =
      run_shares(*threads_, devices_, split, [&](size_t i, int64_t begin, int64_t count) {
        autograd::GradModeGuard same_mode(grad_mode);
        ShareState state(begin, &dropout_seeds);
        InShare in_share(state);
        outs[i] = (*module_)(input.slice(0, begin, begin + count)).cpu();
        norm_stats[i] = std::move(state.batch_stats);
      });
  for (size_t i = 0; i < devices_.size(); i++)
    if (errors[i]) raise(devices_[i], split[i], errors[i]);
  update_batch_norms(norm_stats);
  std::vector<Tensor> parts;
  for (Tensor& o : outs)
    if (o.defined()) parts.push_back(std::move(o));
  return parts.size() == 1 ? parts[0] : concat(parts, 0);
}

}  // namespace opforge::torch::nn
