// The CPU twin of kernels/nonfinite.h: one pass, chunks counted in parallel and added in chunk order.
#include "kernels/nonfinite.h"

#include <atomic>
#include <cmath>

#include "kernels/cpu/op_scope.h"
#include "kernels/cpu/thread_pool.h"

namespace nt::kernels::cpu {

void count_nonfinite(const Exec& exec, const NonfiniteCountArgs& a) {
  NT_CHECK(a.n >= 0 && (a.n == 0 || a.x) && a.count, "count_nonfinite: ", a.n, " values, x ", a.x, ", count ", a.count);
  OpScope scope(exec, "count_nonfinite", profile::OpCost{double(a.n) * sizeof(float), double(a.n)});
  std::atomic<int64_t> total{0};
  parallel_chunks(exec.pool, static_cast<size_t>(a.n), [&](size_t begin, size_t count) {
    int64_t bad = 0;
    for (size_t i = begin; i < begin + count; ++i) bad += !std::isfinite(a.x[i]);
    total.fetch_add(bad, std::memory_order_relaxed);
  });
  *a.count += total.load();
}

}  // namespace nt::kernels::cpu
