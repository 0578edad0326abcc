#include "lmscale/jobs/resilience/preemption.h"

namespace lmscale::jobs {

namespace {
// Written by the handler, read at step boundaries: sig_atomic_t is what a handler may set.
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }
}  // namespace

PreemptionWatch::PreemptionWatch() {
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;   // a signal must not make a file or network call fail
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

bool PreemptionWatch::agreed_stop(parallel::GradientSync& sync) const {
  return sync.sum_scalar(g_signal != 0 ? 1.0 : 0.0) > 0;
}

int PreemptionWatch::signal() const { return g_signal; }

}  // namespace lmscale::jobs
