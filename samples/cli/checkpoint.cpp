#include "checkpoint.hpp"

#include <cmath>
#include <map>
#include <sstream>
#include <vector>

#include "opforge/error.hpp"
#include "opforge/safetensors.hpp"

namespace opforge::cli {
namespace {
constexpr const char* kFile = "checkpoint.safetensors";

// What must be the same for a resumed run to train as the first one did.
std::vector<std::pair<std::string, std::string>> run_identity(const TrainOptions& o) {
  std::vector<std::pair<std::string, std::string>> id = {
      {"model", o.model},
      {"optimizer", o.optimizer},
      {"batch_size", o.batch_auto ? "auto" : std::to_string(o.batch_size)},
      {"seed", std::to_string(o.seed)},
      {"limit", std::to_string(o.limit)},
      {"lr", exact_text(o.lr)},
      {"lr_schedule", o.lr_schedule},
      {"epochs", std::to_string(o.epochs)},
      {"label_smoothing", exact_text(o.label_smoothing)}};
  if (o.batch_auto)
    id.push_back(
        {"batch_bounds", std::to_string(o.batch_min) + ".." + std::to_string(o.batch_max)});
  return id;
}

}  // namespace

std::string exact_text(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

std::optional<double> metadata_number(const std::map<std::string, std::string>& meta,
                                      const std::string& key, const std::string& file) {
  auto it = meta.find(key);
  if (it == meta.end()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  OPFORGE_CHECK(end && *end == 0 && !it->second.empty() && std::isfinite(v))
      << file << ": metadata " << key << " = \"" << it->second << "\" is not a number";
  return v;
}

void save_checkpoint(const std::filesystem::path& dir, const TrainOptions& o,
                     const torch::nn::Module& net, const torch::optim::Optimizer& opt,
                     const RunPosition& at) {
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, t] : net.state_dict()) tensors["model." + name] = t;
  for (const auto& [name, t] : opt.state_dict()) tensors["optim." + name] = t;
  std::map<std::string, std::string> meta;
  for (const auto& [k, v] : run_identity(o)) meta[k] = v;
  meta["epoch"] = std::to_string(at.epoch);
  meta["batches"] = std::to_string(at.batches);
  meta["loss_sum"] = exact_text(at.loss_sum);
  meta["seen"] = std::to_string(at.seen);
  if (at.batch > 0) meta["batch_now"] = std::to_string(at.batch);
  if (at.batch_start > 0) meta["batch_start"] = std::to_string(at.batch_start);
  save_safetensors((dir / kFile).string(), tensors, meta);  // a new file, then renamed over
}

RunPosition load_checkpoint(const std::filesystem::path& dir, const TrainOptions& o,
                            torch::nn::Module& net, torch::optim::Optimizer& opt) {
  const std::filesystem::path file = dir / kFile;
  OPFORGE_CHECK(std::filesystem::exists(file))
      << "--resume " << dir.string() << ": no " << kFile
      << " there (a run folder of opforge train has one after its first epoch)";
  SafetensorsFile f = load_safetensors(file.string());
  for (const auto& [key, want] : run_identity(o)) {
    auto it = f.metadata.find(key);
    OPFORGE_CHECK(it != f.metadata.end() && it->second == want)
        << "--resume " << dir.string() << ": the run was started with " << key << " "
        << (it == f.metadata.end() ? "(none)" : it->second) << ", this one has " << want
        << "; resume with the same options";
  }
  std::map<std::string, Tensor> model, optim;
  for (auto& [name, t] : f.tensors) {
    if (name.rfind("model.", 0) == 0)
      model[name.substr(6)] = t;
    else if (name.rfind("optim.", 0) == 0)
      optim[name.substr(6)] = t;
    else
      throw Error(file.string() + ": an entry \"" + name + "\" that is neither model. nor optim.");
  }
  net.load_state_dict(model);
  opt.load_state_dict(optim);
  auto number = [&](const char* key) {
    std::optional<double> v = metadata_number(f.metadata, key, file.string());
    OPFORGE_CHECK(v) << file.string() << ": no \"" << key << "\" in its metadata";
    return *v;
  };
  RunPosition at;
  at.epoch = int64_t(number("epoch"));
  at.batches = int64_t(number("batches"));
  at.loss_sum = number("loss_sum");
  at.seen = int64_t(number("seen"));
  at.batch = int64_t(metadata_number(f.metadata, "batch_now", file.string()).value_or(0));
  at.batch_start = int64_t(metadata_number(f.metadata, "batch_start", file.string()).value_or(0));
  OPFORGE_CHECK(at.epoch >= 0 && at.batches >= 0 && at.seen >= 0 && at.batch >= 0 &&
                at.batch_start >= 0)
      << file.string() << ": a position before the run's start";
  return at;
}

}  // namespace opforge::cli
