// A small fork-join pool for the CPU backend: parallel_for(n, fn) runs fn(0..n-1) on the workers and
// the calling thread, and returns when all are done. Workers spin briefly before sleeping, because a
// training step issues thousands of short jobs and a sleeping thread takes tens of microseconds to wake.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace nt::kernels {

// A non-owning reference to a callable taking a task index. Unlike std::function it never allocates,
// so handing a lambda to the pool costs nothing inside a training step. The callable must outlive the
// call it is passed to (parallel_for is synchronous, so a temporary lambda does).
class TaskRef {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, TaskRef>>>
  TaskRef(F&& f)  // NOLINT(google-explicit-constructor): lambdas convert implicitly, by design
      : object_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, int64_t i) { (*static_cast<std::remove_reference_t<F>*>(o))(i); }) {}
  void operator()(int64_t i) const { call_(object_, i); }

 private:
  void* object_;
  void (*call_)(void*, int64_t);
};

class ThreadPool {
 public:
  // threads: total threads including the caller; 0 = std::thread::hardware_concurrency().
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs task(i) for i in [0, tasks); tasks are handed out dynamically. Not reentrant.
  void parallel_for(int64_t tasks, TaskRef task);

 private:
  void worker_loop();
  void run_tasks();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  const TaskRef* task_ = nullptr;
  int64_t task_count_ = 0;
  std::atomic<int64_t> next_task_{0};
  std::atomic<int> busy_workers_{0};
  std::atomic<uint64_t> generation_{0};
  bool stopping_ = false;
};

// Runs task over [0, tasks) on the pool when there is one, else inline.
inline void parallel_for(ThreadPool* pool, int64_t tasks, TaskRef task) {
  if (pool && tasks > 1 && pool->size() > 1) {
    pool->parallel_for(tasks, task);
  } else {
    for (int64_t i = 0; i < tasks; ++i) task(i);
  }
}

// Elements per task of an elementwise op: ~256 KB of each fp32 array, far above the pool's dispatch cost.
inline constexpr size_t kElementwiseChunk = size_t(1) << 16;

// Runs body(begin, count) over [0, n) in chunks of `chunk` elements, on the pool when there is one.
// Each element belongs to one chunk whatever the thread count, so elementwise results do not depend on it.
template <class Body>
void parallel_chunks(ThreadPool* pool, size_t n, const Body& body, size_t chunk = kElementwiseChunk) {
  const auto tasks = static_cast<int64_t>((n + chunk - 1) / chunk);
  parallel_for(pool, tasks, [&](int64_t t) {
    const size_t begin = static_cast<size_t>(t) * chunk;
    body(begin, std::min(chunk, n - begin));
  });
}

}  // namespace nt::kernels
