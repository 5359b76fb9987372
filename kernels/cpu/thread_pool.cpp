#include "kernels/cpu/thread_pool.h"

namespace nt::kernels {

namespace {
constexpr int kSpinIterations = 20000;  // ~tens of microseconds: covers the gap between two ops of a step
}

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_tasks() {
  for (int64_t i = next_task_.fetch_add(1); i < task_count_; i = next_task_.fetch_add(1)) (*task_)(i);
}

void ThreadPool::parallel_for(int64_t tasks, TaskRef task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &task;
    task_count_ = tasks;
    next_task_.store(0, std::memory_order_relaxed);
    busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_tasks();
  while (busy_workers_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen && spins < kSpinIterations) ++spins;
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seen = generation_.load(std::memory_order_acquire);
      if (stopping_) return;
    }
    run_tasks();
    busy_workers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace nt::kernels
