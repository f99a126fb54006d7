// `opforge train`'s checkpoints: the model's and the optimiser's state with where the run is (the
// epoch, the batches of it done, the loss so far), in the run folder's checkpoint.safetensors,
// written atomically (at every epoch's end and every --checkpoint-every steps) so that
// `--resume FOLDER` goes on from the last one and reaches what an uninterrupted run would.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "opforge/torch/nn.hpp"
#include "opforge/torch/optim.hpp"
#include "train.hpp"

namespace opforge::cli {

// The numbers in the metadata of the safetensors files opforge train writes: written so that
// they read back exactly; read back as nullopt when absent, an Error naming the file and key when
// not a finite number.
std::string exact_text(double v);
std::optional<double> metadata_number(const std::map<std::string, std::string>& meta,
                                      const std::string& key, const std::string& file);

struct RunPosition {
  int64_t epoch = 0;        // the epoch in progress, from 0
  int64_t batches = 0;      // its batches done
  double loss_sum = 0;      // their losses times their sizes
  int64_t seen = 0;         // their samples
  int64_t batch = 0;        // --batch-size auto: the batch then (all ranks'); 0: the options'
  int64_t batch_start = 0;  // --batch-size auto: the batch the run started with
};

void save_checkpoint(const std::filesystem::path& dir, const TrainOptions& o,
                     const torch::nn::Module& net, const torch::optim::Optimizer& opt,
                     const RunPosition& at);
// Loads dir's checkpoint into net and opt. A run whose options would train differently (model,
// optimiser, batch size, seed, data limit, schedule, epochs, label smoothing) is refused naming
// the first that differs; a model whose parameters differ, naming the parameter and both shapes.
RunPosition load_checkpoint(const std::filesystem::path& dir, const TrainOptions& o,
                            torch::nn::Module& net, torch::optim::Optimizer& opt);

}  // namespace opforge::cli
