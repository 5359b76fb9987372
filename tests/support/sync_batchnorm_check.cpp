#include "sync_batchnorm_check.h"

#include <algorithm>

#include "batchnorm_checks.h"
#include "kernels/runtime.h"

namespace nt::test {

void TwoRankExchange::unused(const char* what) {
  throw Error(cat("TwoRankExchange: ", what, " is not used by the ops it tests"));
}

const std::array<std::vector<float>, 2>& TwoRankExchange::send(const kernels::Exec& exec, const float* data, size_t n) {
  std::vector<float> mine(n);
  kernels::copy_device_to_host(exec, mine.data(), data, n * sizeof(float));
  kernels::synchronize(exec);
  auto& both = sent_[step_];
  both[rank_] = std::move(mine);
  if (both[1 - rank_].size() != n) both[1 - rank_] = both[rank_];  // the other rank has not sent yet
  return both;
}

void TwoRankExchange::all_reduce_mean(const kernels::Exec& exec, float* data, size_t n) {
  const auto& both = send(exec, data, n);
  std::vector<float> mean(n);
  for (size_t i = 0; i < n; ++i) mean[i] = (both[0][i] + both[1][i]) * 0.5f;  // NCCL's average of two
  kernels::copy_host_to_device(exec, data, mean.data(), n * sizeof(float));
  kernels::synchronize(exec);
}

void TwoRankExchange::all_gather(const kernels::Exec& exec, const float* send_data, float* recv, size_t n) {
  const auto& both = send(exec, send_data, n);
  std::vector<float> gathered(both[0]);
  gathered.insert(gathered.end(), both[1].begin(), both[1].end());
  kernels::copy_host_to_device(exec, recv, gathered.data(), 2 * n * sizeof(float));
  kernels::synchronize(exec);
}

namespace {

using kernels::BatchNormArgs;
using kernels::BatchNormPool;
using kernels::BatchNormShape;

std::vector<float> rows(const std::vector<float>& v, size_t from, size_t count) {
  return {v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(from + count)};
}

std::vector<float> halved(std::vector<float> v) {
  for (float& e : v) e *= 0.5f;
  return v;
}

// One rank's buffers on exec's backend, and the op's arguments over them.
struct RankBuffers {
  DeviceBuffer<float> x, y, dy, dx, mean, invstd, rm, rv, dgamma, dbeta, ws;
  DeviceBuffer<int32_t> argmax;
  DeviceBuffer<int64_t> batches;
  RankBuffers(const kernels::Exec& exec, const std::vector<float>& x_rows, const std::vector<float>& dy_rows,
              size_t out, size_t C, const Inputs& in, size_t ws_floats)
      : x(exec, x_rows),
        y(exec, poisoned(out)),
        dy(exec, dy_rows),
        dx(exec, poisoned(x_rows.size())),
        mean(exec, poisoned(C)),
        invstd(exec, poisoned(C)),
        rm(exec, in.rm),
        rv(exec, in.rv),
        dgamma(exec, poisoned(C)),
        dbeta(exec, poisoned(C)),
        ws(exec, poisoned(std::max<size_t>(ws_floats, 1))),
        argmax(exec, std::vector<int32_t>(out, -1)),
        batches(exec, std::vector<int64_t>{0}) {}
};

}  // namespace

void check_synchronized_batchnorm(const kernels::Exec& exec, const BatchNormShape& s, bool relu,
                                  const BatchNormPool* pool) {
  // Both ranks' rows as one batch: the reference, one CPU BatchNorm without synchronization.
  BatchNormShape both = s;
  both.n = 2 * s.n;
  const Inputs in = make_inputs(both, /*affine=*/true);
  const size_t C = static_cast<size_t>(s.c), per_rank = static_cast<size_t>(s.n * s.c * s.hw);
  const size_t out_per_rank = pool ? static_cast<size_t>(s.n * s.c) * pool->p() * pool->q() : per_rank;
  const std::vector<float> dy = random_floats(2 * out_per_rank);
  const BatchNormHyper hyper{.relu = relu};
  Results ref;
  if (pool) {
    ref = run_cpu_pool(both, *pool, hyper, in, dy).r;
  } else {
    ref.y.resize(2 * per_rank), ref.dx.resize(2 * per_rank), ref.mean.resize(C), ref.invstd.resize(C);
    ref.dgamma.resize(C), ref.dbeta.resize(C), ref.rm = in.rm, ref.rv = in.rv;
    BatchNormArgs<float> a{.shape = both,
                           .hyper = hyper,
                           .x = in.x.data(),
                           .gamma = in.gamma.data(),
                           .beta = in.beta.data(),
                           .y = ref.y.data(),
                           .save_mean = ref.mean.data(),
                           .save_invstd = ref.invstd.data(),
                           .running_mean = ref.rm.data(),
                           .running_var = ref.rv.data(),
                           .num_batches_tracked = &ref.batches};
    kernels::batchnorm_forward_train(kernels::Exec{}, a);
    a.dy = dy.data(), a.dx = ref.dx.data(), a.dgamma = ref.dgamma.data(), a.dbeta = ref.dbeta.data();
    kernels::batchnorm_backward(kernels::Exec{}, a);
  }

  // Each rank with its rows, through the exchange.
  TwoRankExchange group;
  const size_t ws_floats = pool ? kernels::batchnorm_pool_workspace_floats(exec.backend, s, *pool, 2)
                                : kernels::batchnorm_workspace_floats(exec.backend, s, 2);
  const DeviceBuffer<float> gamma(exec, in.gamma), beta(exec, in.beta);
  std::array<std::unique_ptr<RankBuffers>, 2> rank;
  for (int r = 0; r < 2; ++r)
    rank[r] = std::make_unique<RankBuffers>(exec, rows(in.x, r * per_rank, per_rank),
                                            rows(dy, r * out_per_rank, out_per_rank), out_per_rank, C, in, ws_floats);
  auto args = [&](int r) {
    RankBuffers& b = *rank[r];
    return BatchNormArgs<float>{.shape = s,
                                .hyper = hyper,
                                .pool = pool ? *pool : BatchNormPool{},
                                .x = b.x.get(),
                                .gamma = gamma.get(),
                                .beta = beta.get(),
                                .y = b.y.get(),
                                .argmax = pool ? b.argmax.get() : nullptr,
                                .save_mean = b.mean.get(),
                                .save_invstd = b.invstd.get(),
                                .running_mean = b.rm.get(),
                                .running_var = b.rv.get(),
                                .num_batches_tracked = b.batches.get(),
                                .dy = b.dy.get(),
                                .dx = b.dx.get(),
                                .dgamma = b.dgamma.get(),
                                .dbeta = b.dbeta.get(),
                                .workspace = b.ws.get(),
                                .group = &group};
  };
  auto forward = [&](int r) {
    group.as(r, 0);
    pool ? kernels::batchnorm_pool_forward_train(exec, args(r)) : kernels::batchnorm_forward_train(exec, args(r));
  };
  auto backward = [&](int r) {
    group.as(r, 1);
    pool ? kernels::batchnorm_pool_backward(exec, args(r)) : kernels::batchnorm_backward(exec, args(r));
  };
  // Rank 1 runs again once rank 0 has sent: its y (the ReLU's mask) and statistics are then the pair's, which its
  // backward's sums need. Rank 0 runs once, so its running statistics moved once.
  forward(1), forward(0), forward(1);
  backward(1), backward(0);
  kernels::synchronize(exec);

  RankBuffers& r0 = *rank[0];
  const double scale = output_scale(both, in, ref);
  const Tolerance y_tol = train_y_tolerance(scale, max_abs(in.x));
  // The statistics: every rank's fp32 partials, combined in another order than the reference's double two-pass.
  const Tolerance stat_tol{1e-6, 1e-5, "statistics: fp32 partials of each rank, combined by Chan's formula"};
  // dx and the sums: fp32 sums of each rank's 2·n·hw/2 terms, then their mean; the reference sums all in double.
  const Tolerance grad_tol{1e-6, 2e-5, "fp32 sums over each rank's rows, averaged over the ranks"};
  NT_REQUIRE_CLOSE(r0.y.download(), rows(ref.y, 0, out_per_rank), y_tol);
  NT_REQUIRE_CLOSE(r0.mean.download(), ref.mean, stat_tol);
  NT_REQUIRE_CLOSE(r0.invstd.download(), ref.invstd, stat_tol);
  NT_REQUIRE_CLOSE(r0.rm.download(), ref.rm, stat_tol);
  NT_REQUIRE_CLOSE(r0.rv.download(), ref.rv, stat_tol);  // the unbiased factor of 2n·hw values
  NT_REQUIRE_CLOSE(r0.dx.download(), rows(ref.dx, 0, per_rank), grad_tol);
  NT_REQUIRE_CLOSE(r0.dgamma.download(), halved(ref.dgamma), grad_tol);
  NT_REQUIRE_CLOSE(r0.dbeta.download(), halved(ref.dbeta), grad_tol);
  REQUIRE(r0.batches.download()[0] == 1);
}

}  // namespace nt::test
