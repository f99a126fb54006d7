// Another process that keeps one core busy for its lifetime: the load that placement
// (`opforge bench --scheduler`) and the data-parallel batch split (`--distributed`) must notice.
#pragma once
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "opforge/error.hpp"

namespace opforge::cli {

class ExternalLoad {
 public:
  explicit ExternalLoad(int core) {
    pid_ = fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls in the child of a threaded process.
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(core, &set);
      sched_setaffinity(0, sizeof(set), &set);
      for (uint64_t x = 0;; x++) asm volatile("" : "+r"(x));
    }
    OPFORGE_CHECK(pid_ > 0) << "bench: cannot start the load process";
  }
  ~ExternalLoad() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  ExternalLoad(const ExternalLoad&) = delete;
  ExternalLoad& operator=(const ExternalLoad&) = delete;

 private:
  pid_t pid_ = -1;
};

// The first core of logical CPU device `d`, from OPFORGE_CPU_DEVICES ("0;1", "0-7;8-15").
inline int first_core_of(int d) {
  const char* env = std::getenv("OPFORGE_CPU_DEVICES");
  OPFORGE_CHECK(env && *env) << "bench: OPFORGE_CPU_DEVICES is not set";
  std::string spec = env;
  size_t start = 0;
  for (int k = 0; k < d; k++) {
    start = spec.find(';', start);
    OPFORGE_CHECK(start != std::string::npos)
        << "bench: OPFORGE_CPU_DEVICES=\"" << spec << "\" has no device " << d;
    start++;
  }
  return std::atoi(spec.c_str() + start);
}

}  // namespace opforge::cli
