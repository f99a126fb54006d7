// A training batch size that follows the machine (`opforge train --batch-size auto`): it grows
// while a larger batch raises the measured throughput and memory has room, and shrinks when
// memory runs short or the throughput falls because a device came under load, within bounds the
// user sets. Off by default: a different batch trains to a different result (the caller scales
// the learning rate with the batch, the linear scaling rule).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace opforge {

class AdaptiveBatchSize {
 public:
  struct Options {
    int64_t min = 16, max = 1024;  // bounds on the batch, both included
    // Every batch a multiple of this (the ranks of a distributed run, each taking an equal
    // part); the bounds are rounded inward to multiples.
    int64_t multiple = 1;
    // Steps left out after each change: a new batch's first calls calibrate its kernels.
    int64_t warmup = 3;
    // A measurement: at least this many steps and this many seconds (short steps are noisy).
    int64_t window = 8;
    double window_seconds = 0.5;
    // A doubled batch is kept only if it raises samples per second by at least this fraction.
    double gain = 0.05;
    // Samples per second this fraction below the batch's usual (smoothed) rate in `load_windows`
    // measurements in a row: a device came under load, and the batch halves.
    double load_drop = 0.25;
    int64_t load_windows = 2;
    // Steps at a settled batch before a larger one is tried again.
    int64_t settle = 200;
  };
  struct Change {
    int64_t step = 0;  // the step after which it changes (counted from 1)
    int64_t from = 0, to = 0;
    std::string why;
  };

  AdaptiveBatchSize(int64_t start, Options options);
  int64_t batch() const { return batch_; }
  // After every step: the samples it ran, its seconds, and whether a device was short of memory
  // (it ran out and went on in micro-batches, or its memory is nearly full; heeded once the
  // warm-up and a window of steps have run at the batch). Returns the change to make before the
  // next step, if any.
  std::optional<Change> record(int64_t samples, double seconds, bool memory_pressure);

 private:
  std::optional<Change> change_to(int64_t to, std::string why);
  Options o_;
  int64_t batch_, step_ = 0, changed_at_ = 0;
  // Measuring the current batch: steps left out, steps and their samples and seconds so far.
  int64_t skip_ = 0, steps_ = 0, samples_ = 0, low_windows_ = 0;
  double seconds_ = 0;
  bool short_in_window_ = false;  // memory ran short during the measurement: no growth after it
  // Probing: the batch before the doubling and its rate, to go back to when it gained too little.
  bool probing_ = false;
  int64_t before_ = 0;
  double before_rate_ = 0;
  double settled_rate_ = 0;    // the current batch's rate once settled (0: not measured yet)
  int64_t settled_since_ = 0;  // the step it settled at
  int64_t cap_ = 0;            // no growth past this after memory ran short (0: none)
};

}  // namespace opforge
