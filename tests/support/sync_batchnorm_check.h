// Synchronized BatchNorm (kernels/batchnorm.h, the `group` field) checked in one process, on either backend: a
// two-rank group played by one process (TwoRankExchange), and the check that rank 0's results equal one BatchNorm
// over both ranks' rows (tests/cpu/test_batchnorm.cpp, tests/cuda/test_batchnorm_cuda.cpp).
#pragma once

#include <array>
#include <map>
#include <vector>

#include "kernels/batchnorm.h"
#include "kernels/collective.h"

namespace nt::test {

// One process as both ranks of a group of two. The test runs each call once per rank with that rank's data, after
// as(rank, step); a collective keeps what each rank sent at that step and returns what the pair would get. Until the
// other rank has sent at that step, it stands in with this rank's values: a result the test runs again.
class TwoRankExchange final : public kernels::ProcessGroup {
 public:
  TwoRankExchange() : ProcessGroup(0, 2) {}
  void as(int rank, int step) { rank_ = rank, step_ = step; }

  std::string describe() const override { return "two ranks in one process"; }
  void all_reduce_mean(const kernels::Exec& exec, float* data, size_t n) override;
  void all_gather(const kernels::Exec& exec, const float* send, float* recv, size_t n) override;
  void all_reduce_sum(const kernels::Exec&, double*, size_t) override { unused("all_reduce_sum"); }
  void all_reduce_sum(const kernels::Exec&, int64_t*, size_t) override { unused("all_reduce_sum"); }
  void broadcast(const kernels::Exec&, void*, size_t) override { unused("broadcast"); }

 private:
  [[noreturn]] static void unused(const char* what);
  // Records this rank's n values (device memory on a CUDA exec) at the step; returns both ranks'.
  const std::array<std::vector<float>, 2>& send(const kernels::Exec& exec, const float* data, size_t n);
  std::map<int, std::array<std::vector<float>, 2>> sent_;  // step -> each rank's values
  int step_ = 0;
};

// Rank 0 of two, each with n rows of `s` (s.n = n), against one unsynchronized CPU BatchNorm over the 2n rows: y,
// save_*, running_* and dx of rank 0's rows equal the single BatchNorm's, and dgamma, dbeta half of its (the ranks'
// mean of their own; kernels/batchnorm.h). pool: batchnorm_pool_* with that pool, else batchnorm_*.
void check_synchronized_batchnorm(const kernels::Exec& exec, const kernels::BatchNormShape& s, bool relu,
                                  const kernels::BatchNormPool* pool = nullptr);

}  // namespace nt::test
