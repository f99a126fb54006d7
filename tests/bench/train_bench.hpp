// `opforge bench --train`: training samples per second of `opforge train`'s models against
// PyTorch's (tests/bench/train_peer.py, PyTorch 2.x from the benchmark virtual environment that
// scripts/bench-venv.sh makes), same model, batch size, optimiser and thread count, the two run
// alternately in one run; with where each one's step time goes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace opforge::cli {

struct TrainBenchOptions {
  std::vector<std::string> models = {"mlp", "cnn"};
  int64_t batch_size = 128;
  int repeats = 3;     // alternated rounds; medians are reported
  int threads = 0;     // 0: every core
  std::string python;  // empty: .venv/bin/python if there is one, else /usr/bin/python3
};

struct TrainPhases {
  double samples_per_second = 0;
  double data_ms = 0, forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
};

struct TrainBenchRow {
  std::string model;
  int64_t steps = 0;
  TrainPhases ours, peer;  // medians over the rounds
  std::string peer_name;   // "PyTorch 2.5.1", or why there is none
  double ratio = 0;        // ours / peer samples per second; 0 without a peer
};

struct TrainBenchResult {
  int threads = 0;
  int64_t batch_size = 0;
  std::vector<TrainBenchRow> rows;
};

TrainBenchResult run_train_bench(const TrainBenchOptions& o);

}  // namespace opforge::cli
