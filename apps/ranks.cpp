#include "apps/ranks.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "apps/command.h"
#include "kernels/runtime.h"

namespace nt::app {

namespace {

constexpr auto kStopGrace = std::chrono::seconds(10);  // SIGTERM, then SIGKILL for a rank that hangs on

int env_number(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || n < 0 || n > 1 << 20) throw Error(cat(name, "=", v, ": not a rank number"));
  return static_cast<int>(n);
}

RankPlace read_place() {
  RankPlace p;
  if (std::getenv("NT_RANK")) {  // a child of --gpus
    p.launcher = RankPlace::Launcher::gpus;
    p.rank = env_number("NT_RANK", 0);
    p.world = env_number("NT_WORLD", 0);
    if (p.world < 1 || p.rank >= p.world) throw Error(cat("NT_RANK=", p.rank, " of NT_WORLD=", p.world));
    if (!std::getenv("NT_NCCL_ID")) throw Error("NT_RANK is set without NT_NCCL_ID (nanotrain train --gpus sets both)");
    p.local_rank = p.rank;
    p.local_world = p.world;
  } else if (kernels::mpi::launched()) {
    if (!kernels::mpi::built())
      throw Error(
          "mpirun started this process, and this build of nanotrain has no MPI: install libopenmpi-dev and build "
          "again (scripts/setup does)");
    kernels::mpi::init();
    p.launcher = RankPlace::Launcher::mpi;
    p.rank = kernels::mpi::rank();
    p.world = kernels::mpi::world();
    p.local_rank = kernels::mpi::local_rank();
    p.local_world = kernels::mpi::local_world();
  }
  return p;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return cat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return cat("was killed by signal ", sig, name ? cat(" (SIG", name, ")") : "");
  }
  return cat("ended with status ", status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

const RankPlace& rank_place() {
  static const RankPlace place = read_place();
  return place;
}

std::string rank_prefix() {
  // Never throws: error reporting calls it.
  try {
    const RankPlace& p = rank_place();
    return p.parallel() ? cat("rank ", p.rank, ": ") : "";
  } catch (const std::exception&) {
    return "";
  }
}

int end_ranks_after_error(int exit_code) {
  std::fflush(stderr);
  if (kernels::mpi::launched() && kernels::mpi::built()) kernels::mpi::abort(exit_code);
  return exit_code;
}

void finish_ranks() {
  if (kernels::mpi::launched() && kernels::mpi::built()) kernels::mpi::finalize();
}

int launch_gpu_ranks(int gpus, const std::vector<std::string>& command_line) {
  std::string why;
  if (!kernels::nccl::available(&why)) throw UsageError(cat("--gpus: ", why));
  const int count = kernels::cuda_device_count();
  if (count < gpus)
    throw UsageError(cat("--gpus ", gpus, ": this machine has ", count, " usable GPU", count == 1 ? "" : "s",
                         count == 0 ? cat(" (", kernels::cuda_unusable_reason(), ")") : ""));
  const std::string id = kernels::nccl::unique_id().hex();

  // The executable by its own path, so that the ranks are named as it is (ps, pgrep), not "exe".
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) throw Error(cat("--gpus: cannot find this executable (/proc/self/exe): ", ec.message()));
  std::vector<char*> argv;
  for (const auto& arg : command_line) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> ranks(static_cast<size_t>(gpus), -1);
  for (int r = 0; r < gpus; ++r) {
    const pid_t pid = fork();
    if (pid < 0) throw Error(cat("--gpus: cannot start rank ", r, ": ", std::strerror(errno)));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // the launcher gone (killed), its ranks go too
      setenv("NT_RANK", std::to_string(r).c_str(), 1);
      setenv("NT_WORLD", std::to_string(gpus).c_str(), 1);
      setenv("NT_NCCL_ID", id.c_str(), 1);
      execv(exe.c_str(), argv.data());
      std::fprintf(stderr, "nanotrain: --gpus: cannot run rank %d: %s\n", r, std::strerror(errno));
      _exit(127);
    }
    ranks[static_cast<size_t>(r)] = pid;
  }

  auto rank_of = [&](pid_t pid) {
    for (size_t r = 0; r < ranks.size(); ++r)
      if (ranks[r] == pid) return static_cast<int>(r);
    return -1;
  };
  int running = gpus, first_failure = -1, failure_status = 0;
  auto stop_time = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, first_failure < 0 ? 0 : WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    if (pid == 0) {  // stopping: give the others time to end, then force them
      if (std::chrono::steady_clock::now() > stop_time)
        for (pid_t p : ranks)
          if (p > 0) kill(p, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    const int r = rank_of(pid);
    if (r < 0) continue;
    ranks[static_cast<size_t>(r)] = -1;
    --running;
    const bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (failed && first_failure < 0) {
      first_failure = r;
      failure_status = status;
      for (pid_t p : ranks)
        if (p > 0) kill(p, SIGTERM);
      stop_time = std::chrono::steady_clock::now() + kStopGrace;
    }
  }
  if (first_failure < 0) return 0;
  std::fprintf(stderr, "nanotrain: --gpus %d: rank %d %s; the other ranks were stopped\n", gpus, first_failure,
               describe_status(failure_status).c_str());
  return exit_code_of(failure_status);
}

std::unique_ptr<kernels::ProcessGroup> join_process_group(const Context& ctx, size_t max_floats) {
  const RankPlace& p = rank_place();
  switch (p.launcher) {
    case RankPlace::Launcher::none:
      return nullptr;
    case RankPlace::Launcher::gpus:
      if (!ctx.on_cuda()) throw Error(cat("--gpus: rank ", p.rank, " could not use its GPU: ", ctx.why_cpu()));
      return kernels::nccl::process_group(ctx.exec(), kernels::nccl::UniqueId::from_hex(std::getenv("NT_NCCL_ID")),
                                          p.rank, p.world);
    case RankPlace::Launcher::mpi:
      if (!ctx.on_cuda()) return kernels::mpi::process_group(max_floats);
      {
        // Every rank is on a GPU or none is: a rank that fell back to the CPU would wait in the wrong transport.
        kernels::nccl::UniqueId id;
        std::string why;
        const bool ok = !p.leader() || kernels::nccl::available(&why);
        if (ok && p.leader()) id = kernels::nccl::unique_id();
        kernels::mpi::broadcast_host(id.bytes.data(), id.bytes.size());
        if (!ok) throw Error(cat("mpirun on GPUs: ", why));
        return kernels::nccl::process_group(ctx.exec(), id, p.rank, p.world);
      }
  }
  return nullptr;
}

ContextOptions rank_context(ContextOptions options) {
  const RankPlace& p = rank_place();
  if (!p.parallel()) return options;
  options.gpu = p.local_rank;
  if (options.threads == 0 && p.local_world > 1)
    options.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / p.local_world);
  return options;
}

}  // namespace nt::app
