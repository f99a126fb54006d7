// `opforge bench --train` (train_bench.hpp): opforge's side runs in this process
// (time_training), PyTorch's in a child process (train_peer.py --steps), alternately.
#include "train_bench.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "opforge/error.hpp"
#include "train.hpp"

#ifndef OPFORGE_SOURCE_DIR
#define OPFORGE_SOURCE_DIR "."
#endif

namespace opforge::cli {
namespace {

// Untimed steps before each timed run: opforge's placement model calibrates a new shape's
// variants in its first calls (three timed runs of each), which the first round pays for.
constexpr int64_t kWarmup = 20;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

TrainPhases median_of(const std::vector<TrainPhases>& runs) {
  auto m = [&](double TrainPhases::*f) {
    std::vector<double> v;
    for (const TrainPhases& r : runs) v.push_back(r.*f);
    return median(v);
  };
  return {m(&TrainPhases::samples_per_second), m(&TrainPhases::data_ms),
          m(&TrainPhases::forward_ms), m(&TrainPhases::backward_ms), m(&TrainPhases::optimizer_ms)};
}

std::string default_python() {
  if (std::filesystem::exists(".venv/bin/python")) return ".venv/bin/python";
  std::string venv = std::string(OPFORGE_SOURCE_DIR) + "/.venv/bin/python";
  if (std::filesystem::exists(venv)) return venv;
  return "/usr/bin/python3";
}

// Runs the peer; its JSON line, or an Error with what it printed.
nlohmann::json run_peer(const std::string& python, const std::string& model, int64_t batch,
                        int64_t steps, int threads) {
  std::string cmd = "'" + python + "' '" OPFORGE_SOURCE_DIR "/tests/bench/train_peer.py' --model " +
                    model + " --batch-size " + std::to_string(batch) + " --steps " +
                    std::to_string(steps) + " --warmup " + std::to_string(kWarmup) + " --threads " +
                    std::to_string(threads) + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  OPFORGE_CHECK(pipe) << "cannot start " << cmd;
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe.get())) out.append(buf.data(), n);
  int status = pclose(pipe.release());
  size_t brace = out.rfind("\n{");
  brace = brace == std::string::npos ? out.find('{') : brace + 1;
  OPFORGE_CHECK(status == 0 && brace != std::string::npos)
      << "the PyTorch peer failed (" << cmd
      << "): " << out.substr(out.size() > 600 ? out.size() - 600 : 0);
  return nlohmann::json::parse(out.substr(brace));
}

}  // namespace

TrainBenchResult run_train_bench(const TrainBenchOptions& o) {
  TrainBenchResult r;
  r.threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  r.batch_size = o.batch_size;
  const std::string python = o.python.empty() ? default_python() : o.python;
  for (const std::string& model : o.models) {
    TrainBenchRow row;
    row.model = model;
    // About two seconds of opforge's training per round on two cores.
    row.steps = model == "cnn" ? 30 : 150;
    TrainOptions t;
    t.model = model;
    t.batch_size = o.batch_size;
    std::vector<TrainPhases> ours, peer;
    std::string peer_error;
    for (int round = 0; round < o.repeats; round++) {
      TrainTiming ti = time_training(t, row.steps, kWarmup);
      ours.push_back(
          {ti.samples_per_second, ti.data_ms, ti.forward_ms, ti.backward_ms, ti.optimizer_ms});
      if (!peer_error.empty()) continue;
      try {
        nlohmann::json j = run_peer(python, model, o.batch_size, row.steps, r.threads);
        const auto& ms = j.at("ms_per_step");
        peer.push_back({j.at("samples_per_second").get<double>(), ms.at("data").get<double>(),
                        ms.at("forward").get<double>(), ms.at("backward").get<double>(),
                        ms.at("optimizer").get<double>()});
        row.peer_name = "PyTorch " + j.at("torch").get<std::string>();
      } catch (const std::exception& e) {
        peer_error = e.what();
      }
    }
    row.ours = median_of(ours);
    if (peer.empty()) {
      row.peer_name = "no peer: " + peer_error + " (scripts/bench-venv.sh makes .venv)";
    } else {
      row.peer = median_of(peer);
      row.ratio = row.ours.samples_per_second / row.peer.samples_per_second;
    }
    r.rows.push_back(std::move(row));
  }
  return r;
}

}  // namespace opforge::cli
