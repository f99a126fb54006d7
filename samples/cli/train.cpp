// The training loop of `opforge train` and the evaluation of `opforge eval`, over opforge::torch.
#include "train.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "auto_batch.hpp"
#include "checkpoint.hpp"
#include "opforge/dispatch.hpp"
#include "opforge/safetensors.hpp"
#include "opforge/torch.hpp"
#include "opforge/torch/data.hpp"
#include "opforge/torch/distributed.hpp"
#include "plot.hpp"
#include "train_devices.hpp"

namespace opforge::cli {
using namespace opforge::torch;

std::shared_ptr<nn::Module> make_model(const std::string& name, Generator& g) {
  if (name == "mlp")
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Flatten>(),
        std::make_shared<nn::Linear>(784, 512, true, DType::Float32, g),
        std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(512, 256, true, DType::Float32, g),
        std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(256, 10, true, DType::Float32, g)});
  if (name == "cnn") {
    // conv 5x5 32 -> max-pool 2 -> conv 5x5 64 -> max-pool 2 -> linear 128 -> linear 10
    Pool2dOptions pool2;  // 2x2, stride 2
    return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Conv2d>(1, 32, 5, Conv2dOptions{}, true, DType::Float32, g),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(pool2),
        std::make_shared<nn::Conv2d>(32, 64, 5, Conv2dOptions{}, true, DType::Float32, g),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(pool2),
        std::make_shared<nn::Flatten>(),
        std::make_shared<nn::Linear>(64 * 4 * 4, 128, true, DType::Float32, g),
        std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(128, 10, true, DType::Float32, g)});
  }
  throw Error("unknown model \"" + name + "\"; expected mlp or cnn");
}

namespace {
namespace fs = std::filesystem;
using Seconds = std::chrono::duration<double>;

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o, std::vector<Tensor> p) {
  if (o.optimizer == "sgd")
    return std::make_unique<optim::SGD>(
        std::move(p), optim::SGDOptions{.lr = o.lr ? o.lr : 0.05, .momentum = 0.9});
  if (o.optimizer == "adam")
    return std::make_unique<optim::Adam>(std::move(p),
                                         optim::AdamOptions{.lr = o.lr ? o.lr : 1e-3});
  if (o.optimizer == "adamw")
    return std::make_unique<optim::AdamW>(std::move(p),
                                          optim::AdamWOptions{.lr = o.lr ? o.lr : 1e-3});
  throw Error("unknown optimizer \"" + o.optimizer + "\"; expected sgd, adam or adamw");
}

// The learning-rate schedule, stepped once per epoch: cosine annealing to 0 over the run, or a
// tenth of the rate every third of it; none keeps it constant.
std::unique_ptr<optim::LambdaLR> make_schedule(const TrainOptions& o, optim::Optimizer& opt) {
  if (o.lr_schedule == "none") return nullptr;
  if (o.lr_schedule == "cosine") return std::make_unique<optim::CosineAnnealingLR>(opt, o.epochs);
  if (o.lr_schedule == "step")
    return std::make_unique<optim::StepLR>(opt, std::max<int64_t>(o.epochs / 3, 1));
  throw Error("unknown learning-rate schedule \"" + o.lr_schedule +
              "\"; expected none, cosine or step");
}

// The inputs standardised by the training images' mean and standard deviation, as torchvision's
// Normalize does (for Fashion-MNIST about 0.286 and 0.353). They go into the weights' metadata,
// so that `opforge eval` (and PyTorch, tests/fixtures/eval_in_torch.py) feed the model the same.
struct Standardize {
  double mean = 0, std = 1;
  void apply(data::Dataset& d) const { d.images = div(sub(d.images, mean), std); }
};
Standardize standardize(data::FashionMnist& fm) {
  Standardize s{mean(fm.train.images).item(), std::sqrt(var(fm.train.images).item())};
  OPFORGE_CHECK(s.std > 0) << "the training images are all " << s.mean << ": nothing to learn";
  s.apply(fm.train);
  s.apply(fm.test);
  return s;
}

std::string default_run_folder(const std::string& model) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::ostringstream os;
  os << "runs/" << model << "-" << std::put_time(&tm, "%Y%m%d-%H%M%S");
  return os.str();
}

// Calls per device since the process started (the dispatcher's statistics).
std::map<std::string, int64_t> calls_per_device() {
  std::map<std::string, int64_t> out;
  for (const DispatchStat& s : dispatch_stats()) out[s.device.str()] += s.calls;
  return out;
}
std::string shares(const std::map<std::string, int64_t>& before,
                   const std::map<std::string, int64_t>& after) {
  std::vector<std::pair<std::string, int64_t>> ran;  // the devices that ran some
  for (auto& [dev, n] : after) {
    auto it = before.find(dev);
    int64_t d = n - (it == before.end() ? 0 : it->second);
    if (d > 0) ran.emplace_back(dev, d);
  }
  return percent_str(shares_of(ran));
}

// One line of progress: redrawn in place on a terminal, printed every tenth of an epoch else.
class Progress {
 public:
  Progress(int64_t epochs, int64_t steps) : epochs_(epochs), steps_(steps), tty_(isatty(1)) {}
  void update(int64_t epoch, int64_t step, double loss, double samples_per_s, double eta_s,
              const std::string& split) {
    bool tenth = steps_ >= 10 && (step + 1) % (steps_ / 10) == 0;
    if (!tty_ && !tenth && step + 1 != steps_) return;
    std::ostringstream os;
    int filled = int(30 * (step + 1) / steps_);
    os << "epoch " << epoch + 1 << "/" << epochs_ << " [" << std::string(size_t(filled), '#')
       << std::string(size_t(30 - filled), '.') << "] step " << step + 1 << "/" << steps_
       << " loss " << std::fixed << std::setprecision(4) << loss << " " << std::setprecision(0)
       << samples_per_s << " samples/s ETA " << std::setprecision(0) << eta_s << " s";
    if (!split.empty()) os << " [" << split << "]";
    if (tty_)
      std::cout << "\r" << os.str() << "\033[K" << std::flush;
    else
      std::cout << os.str() << "\n";
  }
  void end_epoch() {
    if (tty_) std::cout << "\n";
  }
  void set_steps(int64_t steps) { steps_ = std::max<int64_t>(steps, 1); }

 private:
  int64_t epochs_, steps_;
  bool tty_;
};

// Accuracy of `net` on `d`, and the confusion matrix (rows: true class, columns: predicted).
double accuracy(nn::Module& net, const data::Dataset& d, int64_t batch,
                std::vector<std::vector<int64_t>>* confusion = nullptr) {
  autograd::NoGradGuard no_grad;
  bool was = net.is_training();
  net.eval();
  int64_t right = 0;
  if (confusion) confusion->assign(10, std::vector<int64_t>(10, 0));
  for (int64_t at = 0; at < d.size(); at += batch) {
    int64_t n = std::min(batch, d.size() - at);
    auto pred = argmax(net(d.images.slice(0, at, at + n)), 1).to_vector<int64_t>();
    auto truth = d.labels.slice(0, at, at + n).to_vector<int64_t>();
    for (int64_t i = 0; i < n; i++) {
      right += pred[size_t(i)] == truth[size_t(i)];
      if (confusion) (*confusion)[size_t(truth[size_t(i)])][size_t(pred[size_t(i)])]++;
    }
  }
  net.train(was);
  return double(right) / double(std::max<int64_t>(d.size(), 1));
}

// A resumed run's metrics: the first `epochs` lines of its metrics.csv (the epochs its checkpoint
// finished; a line written after the checkpoint is dropped, as that epoch runs again), their
// losses and accuracies for the plot.
void read_metrics(const fs::path& file, int64_t epochs, std::vector<double>& losses,
                  std::vector<double>& accuracies) {
  std::ifstream in(file);
  OPFORGE_CHECK(in.good()) << "--resume: cannot read " << file.string();
  std::string header, line;
  std::getline(in, header);
  std::vector<std::string> kept;
  while (int64_t(kept.size()) < epochs && std::getline(in, line)) {
    std::stringstream ss(line);
    std::string epoch, loss, acc;
    std::getline(ss, epoch, ',');
    std::getline(ss, loss, ',');
    std::getline(ss, acc, ',');
    char* end1 = nullptr;
    char* end2 = nullptr;
    double l = std::strtod(loss.c_str(), &end1), a = std::strtod(acc.c_str(), &end2);
    OPFORGE_CHECK(end1 && *end1 == 0 && end2 && *end2 == 0 && !loss.empty() && !acc.empty())
        << file.string() << ": line " << kept.size() + 2 << " is not an epoch's metrics";
    losses.push_back(l);
    accuracies.push_back(a);
    kept.push_back(line);
  }
  in.close();
  std::ofstream out(file, std::ios::trunc);
  out << header << "\n";
  for (const std::string& k : kept) out << k << "\n";
}
}  // namespace

int run_train(const TrainOptions& given) {
  TrainOptions o = given;
  OPFORGE_CHECK(o.epochs > 0 && o.batch_size > 0) << "--epochs and --batch-size must be positive";
  OPFORGE_CHECK(o.device == "auto" || device_exists(parse_device(o.device)))
      << "--device " << o.device << ": no such device here (opforge info lists them)";
  OPFORGE_CHECK(o.device == "auto" || o.devices.empty())
      << "--device and --devices: give one or the other";
  if (o.batch_auto && o.distributed) {  // all ranks' batch, a multiple of their number
    distributed::init();
    const int64_t w = distributed::world_size();
    o.batch_size = batch_for_ranks(o.batch_size, o.batch_min, o.batch_max, w);
  }
  Generator g(o.seed);
  std::shared_ptr<nn::Module> net = make_model(o.model, g);
  data::FashionMnist fm =
      data::load_fashion_mnist(o.data.empty() ? data::kFashionMnistDir : o.data);
  const Standardize inputs = standardize(fm);
  data::Dataset train = data::head(fm.train, o.limit);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(o, net->parameters());
  std::unique_ptr<optim::LambdaLR> schedule = make_schedule(o, *opt);
  Stepper stepper(o, net);
  // Rank 0 prints and writes the run folder.
  Ranks ranks(o, *net, train.size());
  const bool lead = ranks.lead();
  struct RestoreCout {
    std::streambuf* buf;
    ~RestoreCout() { std::cout.rdbuf(buf); }
  } restore{std::cout.rdbuf()};
  if (!lead) std::cout.rdbuf(nullptr);  // the other ranks' errors still reach stderr

  OPFORGE_CHECK(o.resume.empty() || o.out.empty() || fs::path(o.out) == fs::path(o.resume))
      << "--resume " << o.resume << " goes on in that folder: --out " << o.out << " differs";
  const fs::path dir = !o.resume.empty() ? fs::path(o.resume)
                       : o.out.empty()   ? fs::path(default_run_folder(o.model))
                                         : fs::path(o.out);
  if (lead) fs::create_directories(dir);
  RunPosition start;
  std::vector<double> losses, accuracies;
  if (!o.resume.empty()) {
    // The schedule stepped as far as the run had gone gives the rate the checkpoint holds.
    RunPosition at = load_checkpoint(dir, o, *net, *opt);
    const double saved_lr = opt->lr();
    for (int64_t e = 0; schedule && e < at.epoch; e++) schedule->step();
    if (at.batch > 0) opt->set_lr(saved_lr);  // --batch-size auto: the rate as it was, scaled
    start = at;
    if (lead) read_metrics(dir / "metrics.csv", at.epoch, losses, accuracies);
  }
  std::cout << "opforge train: " << o.model << ", " << train.size() << " training and "
            << fm.test.size() << " test images, batch " << o.batch_size << ", " << o.optimizer
            << " lr " << opt->lr() << (schedule ? " (" + o.lr_schedule + " schedule)" : "") << ", "
            << o.epochs << " epoch(s)"
            << (stepper.parallel() ? ", data-parallel over " + stepper.device_names() : "")
            << (o.distributed ? ", " + std::to_string(ranks.world) + " rank(s) of mpirun" : "")
            << "; run folder " << dir.string() << "\n";
  std::ofstream csv;
  if (lead && o.resume.empty()) {
    csv.open(dir / "metrics.csv");
    csv << "epoch,train_loss,test_accuracy,seconds,samples_per_second,device_shares,batch_split,"
           "micro_batches,batch_size,batch_changes\n";
  } else if (lead) {
    csv.open(dir / "metrics.csv", std::ios::app);
  }

  data::DataLoader loader(train, o.batch_size / ranks.world, true, o.seed);
  ranks.shard(loader);
  AutoBatch auto_batch(o, ranks.rank, ranks.world);
  auto_batch.resume_at(start.batch, start.batch_start, loader);
  // Where the run is, for a checkpoint: with --batch-size auto, also its batch now and at the
  // start.
  auto position = [&](int64_t epoch, int64_t batches, double loss_sum, int64_t seen) {
    const bool a = auto_batch.on();
    return RunPosition{
        epoch, batches, loss_sum, seen, a ? auto_batch.batch() : 0, a ? auto_batch.start() : 0};
  };
  Progress progress(o.epochs, loader.batches_per_epoch());
  int64_t steps = 0;  // run by this process
  for (int64_t epoch = start.epoch; epoch < o.epochs; epoch++) {
    auto calls_before = calls_per_device();
    auto start_time = std::chrono::steady_clock::now();
    loader.start_epoch(epoch);
    stepper.reset();
    double loss_sum = 0;
    int64_t seen = 0, batch_no = 0;                   // batches of the epoch done
    if (epoch == start.epoch && start.batches > 0) {  // resumed within this epoch
      // This rank's samples done (their batches' sizes changed with --batch-size auto); at an
      // epoch's last step the count holds the samples repeated to share it among the first
      // run's ranks, which may have been more.
      const int64_t done =
          std::min(loader.samples_per_epoch(),
                   (std::min(start.seen, train.size()) + ranks.world - 1) / ranks.world);
      loader.start_epoch(epoch, done);
      loss_sum = start.loss_sum;
      seen = start.seen;
      batch_no = start.batches;
    }
    const int64_t before_loader = batch_no;  // batches the loader did not hand out
    progress.set_steps(before_loader + loader.batches_per_epoch());
    while (std::optional<data::Batch> b = loader.next()) {
      const auto step_start = std::chrono::steady_clock::now();
      opt->zero_grad();
      Tensor loss = stepper.step(b->images, b->labels);
      if (o.distributed) {  // the gradients' and the loss's means over the ranks
        ranks.finish_gradients();
        loss = loss.detach().clone();
        distributed::all_reduce_mean({loss});
      }
      opt->step();
      double l = loss.item();
      // The step already changed the weights; those of the last finished epoch are on disk.
      OPFORGE_CHECK(std::isfinite(l))
          << "the loss became " << l << " at step " << batch_no + 1 << " of epoch " << epoch + 1
          << "; training stopped (the weights and metrics of the last finished epoch are kept in "
          << dir.string() << "); try a smaller learning rate (--lr, now " << opt->lr() << ")";
      if (auto_batch.on()) {
        auto_batch.after_step(b->labels.size(0),
                              Seconds(std::chrono::steady_clock::now() - step_start).count(),
                              stepper.memory_short(), loader, *opt);
        progress.set_steps(before_loader + loader.batches_per_epoch());
      }
      loss_sum += l * double(b->labels.size(0) * ranks.world);
      seen += b->labels.size(0) * ranks.world;
      double elapsed = Seconds(std::chrono::steady_clock::now() - start_time).count();
      double rate = double(seen) / std::max(elapsed, 1e-9);
      progress.update(epoch, batch_no, l, rate, double(train.size() - seen) / std::max(rate, 1e-9),
                      stepper.last_split());
      steps++;
      batch_no++;
      const RunPosition here = position(epoch, batch_no, loss_sum, seen);
      if (o.max_steps > 0 && steps == o.max_steps) {
        if (lead) save_checkpoint(dir, o, *net, *opt, here);
        progress.end_epoch();
        std::cout << "stopped after " << steps << " steps, " << here.batches
                  << " batches into epoch " << epoch + 1 << "; go on with --resume " << dir.string()
                  << "\n";
        return 0;
      }
      if (lead && o.checkpoint_every > 0 && steps % o.checkpoint_every == 0)
        save_checkpoint(dir, o, *net, *opt, here);
    }
    progress.end_epoch();
    double seconds = Seconds(std::chrono::steady_clock::now() - start_time).count();
    double acc = lead ? accuracy(*net, fm.test, 1000) : 0;
    std::string share = shares(calls_before, calls_per_device());
    const std::string batch_changes = auto_batch.take_changes();
    losses.push_back(loss_sum / double(seen));
    accuracies.push_back(acc);
    std::cout << "epoch " << epoch + 1 << ": train loss " << std::fixed << std::setprecision(4)
              << losses.back() << ", test accuracy " << std::setprecision(2) << 100 * acc << "%, "
              << std::setprecision(1) << seconds << " s (" << std::setprecision(0)
              << double(seen) / seconds << " samples/s); kernels: " << share
              << (stepper.parallel()
                      ? "; batch split: " + stepper.split_since_reset() + stepper.micro_batches()
                      : "")
              << (auto_batch.on() ? "; batch size " + std::to_string(auto_batch.batch()) +
                                        (batch_changes.empty() ? "" : " (" + batch_changes + ")")
                                  : "")
              << "\n";
    if (schedule) {  // the schedule's rate, scaled for the batch of --batch-size auto
      schedule->step();
      opt->set_lr(opt->lr() * auto_batch.scale());
    }
    if (!lead) continue;
    // Each epoch's results are on disk before the next starts: a failed run keeps them. The
    // checkpoint last: a run stopped before it repeats the epoch, and --resume drops the line.
    csv << epoch + 1 << "," << losses.back() << "," << acc << "," << seconds << ","
        << double(seen) / seconds << "," << share << "," << stepper.split_since_reset() << ","
        << stepper.micro_batch_list() << "," << auto_batch.batch() << "," << batch_changes << "\n"
        << std::flush;
    save_safetensors((dir / "weights.safetensors").string(), net->state_dict(),
                     {{"model", o.model},
                      {"epochs", std::to_string(epoch + 1)},
                      {"input_mean", exact_text(inputs.mean)},
                      {"input_std", exact_text(inputs.std)}});
    draw_training_plot((dir / "plot.svg").string(), losses, accuracies);
    save_checkpoint(dir, o, *net, *opt, position(epoch + 1, 0, 0, 0));
  }
  std::cout << "run folder: " << dir.string() << " (weights.safetensors, metrics.csv, plot.svg)\n";
  return 0;
}

TrainTiming time_training(const TrainOptions& o, int64_t steps, int64_t warmup) {
  OPFORGE_CHECK(steps > 0 && warmup >= 0) << "time_training: steps must be positive";
  Generator g(o.seed);
  std::shared_ptr<nn::Module> net = make_model(o.model, g);
  static data::FashionMnist fm = [&] {
    data::FashionMnist d =
        data::load_fashion_mnist(o.data.empty() ? data::kFashionMnistDir : o.data);
    standardize(d);
    return d;
  }();
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(o, net->parameters());
  Stepper stepper(o, net);
  nn::CrossEntropyLoss criterion(o.label_smoothing);
  // Distributed: this rank's part of each batch, the gradients averaged in the backward pass;
  // the figure is the batch of all ranks together per second.
  const data::Dataset some = data::head(fm.train, (steps + warmup) * o.batch_size);
  Ranks ranks(o, *net, some.size());
  data::DataLoader loader(some, o.batch_size / ranks.world, true, o.seed, true);
  ranks.shard(loader);
  loader.start_epoch(0);
  using Clock = std::chrono::steady_clock;
  double phase[5] = {0, 0, 0, 0, 0};
  Clock::time_point start;
  for (int64_t s = 0; s < warmup + steps; s++) {
    if (s == warmup) {
      std::fill(std::begin(phase), std::end(phase), 0.0);
      stepper.reset();
      start = Clock::now();
    }
    auto t0 = Clock::now();
    std::optional<data::Batch> b = loader.next();
    OPFORGE_CHECK(b) << "time_training: the data ran out at step " << s;
    auto t1 = Clock::now();
    Tensor loss;
    if (stepper.parallel())
      loss = stepper.step(b->images, b->labels);  // the shares' passes overlap: all "forward"
    else
      loss = criterion((*net)(b->images), b->labels);
    auto t2 = Clock::now();
    if (!stepper.parallel()) loss.backward();
    auto t_reduce = Clock::now();
    ranks.finish_gradients();
    auto t3 = Clock::now();
    opt->step();
    opt->zero_grad();
    loss.item();  // waits for whatever is still queued
    auto t4 = Clock::now();
    phase[0] += Seconds(t1 - t0).count();
    phase[1] += Seconds(t2 - t1).count();
    phase[2] += Seconds(t3 - t2).count();
    phase[3] += Seconds(t4 - t3).count();
    phase[4] += Seconds(t3 - t_reduce).count();
  }
  double seconds = Seconds(Clock::now() - start).count();
  double ms = 1e3 / double(steps);
  return {double(steps * o.batch_size) / seconds,
          phase[0] * ms,
          phase[1] * ms,
          phase[2] * ms,
          phase[3] * ms,
          phase[4] * ms,
          stepper.shares_since_reset(),
          stepper.share_ms_since_reset()};
}

int run_eval(const EvalOptions& o) {
  SafetensorsFile f = load_safetensors(o.weights);
  auto model = f.metadata.find("model");
  OPFORGE_CHECK(model != f.metadata.end())
      << o.weights << ": no \"model\" in its metadata (was it written by opforge train?)";
  Generator g(0);
  std::shared_ptr<nn::Module> net = make_model(model->second, g);
  net->load_state_dict(f.tensors);
  data::FashionMnist fm =
      data::load_fashion_mnist(o.data.empty() ? data::kFashionMnistDir : o.data);
  // Inputs as the model was trained on them (weights from before standardisation have none).
  Standardize inputs;
  auto read = [&](const char* key, double& v) {
    v = metadata_number(f.metadata, key, o.weights).value_or(v);
  };
  read("input_mean", inputs.mean);
  read("input_std", inputs.std);
  inputs.apply(fm.test);
  std::vector<std::vector<int64_t>> confusion;
  double acc = accuracy(*net, fm.test, o.batch_size, &confusion);
  std::cout << "test accuracy " << std::fixed << std::setprecision(2) << 100 * acc << "% on "
            << fm.test.size()
            << " images\nconfusion matrix (rows: true class, columns: "
               "predicted)\n      ";
  for (int c = 0; c < 10; c++) std::cout << std::setw(6) << c;
  std::cout << "\n";
  for (int r = 0; r < 10; r++) {
    std::cout << std::setw(6) << r;
    for (int c = 0; c < 10; c++) std::cout << std::setw(6) << confusion[size_t(r)][size_t(c)];
    std::cout << "\n";
  }
  return 0;
}

}  // namespace opforge::cli
