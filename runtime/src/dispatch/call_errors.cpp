// Halide's error text, captured per call or per thread (never from one process-wide slot), and the
// errors of queued calls, kept for the thread that submitted them.
#include <HalideRuntime.h>

#include <mutex>

#include "dispatch/dispatch_state.hpp"

namespace opforge::detail {
namespace {

// Halide reports an error with the user context of the kernel call that hit it, on whichever
// thread did (a worker, for a parallel loop): the message goes to that call's own slot
// (UserContext::error). Errors outside kernel calls (the runtime's own device copies) go to the
// reporting thread's slot.
thread_local std::string halide_error_message;

void halide_error_to_message(void* user_context, const char* msg) {
  auto* u = static_cast<UserContext*>(user_context);
  if (u && u->error) {
    // Only failing calls get here; parallel workers of one call may report at once.
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    if (u->error->size() < 4096) *u->error += msg;
    return;
  }
  // Worker threads never clear theirs: keep the latest message only.
  if (halide_error_message.size() > 4096) halide_error_message.clear();
  halide_error_message += msg;
}

}  // namespace

void install_halide_error_handler() {
  static const bool installed = [] {
    halide_set_error_handler(halide_error_to_message);
    return true;
  }();
  (void)installed;
}

std::string& thread_halide_error() { return halide_error_message; }

std::string take_halide_error() {
  install_halide_error_handler();
  std::string m;
  m.swap(halide_error_message);
  while (!m.empty() && m.back() == '\n') m.pop_back();
  return m;
}

void ErrorSink::add(const std::string& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_.empty()) first_ = e;
}

std::string ErrorSink::take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string e;
  e.swap(first_);
  return e;
}

// The errors of the queued calls one thread submitted, raised by that thread's synchronize(): a
// failure belongs to whoever made the call, not to the next thread that synchronizes.
const std::shared_ptr<ErrorSink>& thread_errors() {
  thread_local const std::shared_ptr<ErrorSink> sink = std::make_shared<ErrorSink>();
  return sink;
}

}  // namespace opforge::detail
