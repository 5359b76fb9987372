// BatchNorm on the CPU: the reference twin of kernels/cuda/batchnorm.cu and batchnorm_pool.cu (contract in
// kernels/batchnorm.h; the fused convolution stem's twin is kernels/cpu/conv_batchnorm_pool.cpp).
//
// Layouts: NCHW x[(n·C + c)·hw + i], NHWC x[(n·hw + i)·C + c]; per channel the count = n·hw values are
// visited in ONE order in both layouts, k = n·hw + i ascending, so NCHW and NHWC give the same bits.
// Numerics: every statistic and every output is computed in double (for fp32 data too) and rounded once
// at the store:
//   forward_train  two passes over x: mean = Σx / count, then var = Σ(x - mean)² / count, the textbook
//                  two-pass variance, which cannot go negative and keeps its precision when the mean is
//                  large against the spread; then y = (x - mean)·(invstd·gamma) + beta (x - mean first,
//                  so a large mean does not cancel against the shift). running_var uses var·count/(count-1).
//   forward_eval   y = (x - running_mean)·(gamma/sqrt(running_var + eps)) + beta.
//   backward       one pass for Σdy' and Σdy'·(x - mean) (centred, so the mean does not cancel), then
//                  dx = gamma·invstd·(dy' - Σdy'/count - (x - mean)·invstd · Σdy'·xhat / count).
// Everything is written with `=`. ReLU: y = (v < 0 ? 0 : v), a NaN stays NaN; dy' = (y > 0 ? dy : 0).
// No workspace (batchnorm_workspace_floats is 0): per-channel sums live in locals.
// Synchronized (kernels/batchnorm.h): the forward's per-channel moments go out as fp32 (mean, M2, count) through the
// workspace, every rank's come back, and each channel combines them in rank order with Chan's formula in double:
//   n = na + nb, d = mb - ma, mean = ma + d·nb/n, M2 = M2a + M2b + d²·na·nb/n;
// the backward's sums go out as fp32 and come back as the ranks' mean. A synchronized call splits into two
// profiler rows around its collective (batchnorm_stats or batchnorm_backward_reduce, then the op's own).
// Fused max-pool (batchnorm_pool_*): the two ops in sequence through a full-resolution scratch in the
// workspace, the reference the GPU's fused kernels are checked against: forward = maxpool2d_forward of the
// BatchNorm's output; backward = the pooled gradient masked by (y > 0) with relu, scattered to the argmax by
// maxpool2d_backward, then the BatchNorm backward without its ReLU.
//
// Threads: the tasks are channel groups (one channel in NCHW, whose planes are contiguous; kGroup
// adjacent channels in NHWC, so that a task reads whole cache lines of each row). A channel is summed by
// one task, in the order above, so the results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/batchnorm.h"
#include "kernels/collective.h"
#include "kernels/cpu/op_scope.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/operand.h"
#include "kernels/pool.h"

namespace nt::kernels::cpu {

namespace {

constexpr int64_t kGroup = 16;  // NHWC channels per task: 64 bytes of each fp32 row

struct Groups {
  int64_t size;   // channels per task
  int64_t count;  // tasks
};

Groups groups_of(const BatchNormShape& s) {
  const int64_t size = s.layout == Layout::nchw ? 1 : std::min<int64_t>(kGroup, s.c);
  return {size, (s.c + size - 1) / size};
}

// Calls f(j, idx) for every element idx of the channels c0 + j, j in [0, cn), each channel's elements in
// the order k = n·hw + i ascending.
template <class F>
void for_each_element(const BatchNormShape& s, int64_t c0, int64_t cn, const F& f) {
  const int64_t C = s.c, hw = s.hw;
  if (s.layout == Layout::nchw) {
    for (int64_t j = 0; j < cn; ++j)
      for (int64_t n = 0; n < s.n; ++n) {
        const int64_t base = (n * C + c0 + j) * hw;  // plane (n, c): hw contiguous values
        for (int64_t i = 0; i < hw; ++i) f(j, base + i);
      }
  } else {
    const int64_t rows = s.n * hw;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = r * C + c0;  // row r = n·hw + i: C contiguous channels
      for (int64_t j = 0; j < cn; ++j) f(j, base + j);
    }
  }
}

// Runs task(c0, cn) over the channel groups, on the pool when there is one.
template <class Task>
void for_channel_groups(const Exec& exec, const BatchNormShape& s, const Task& task) {
  const Groups g = groups_of(s);
  parallel_for(exec.pool, g.count, [&](int64_t t) {
    const int64_t c0 = t * g.size;
    task(c0, std::min(g.size, s.c - c0));
  });
}

template <class T>
T relu_of(double v) {
  const T t = static_cast<T>(v);
  return t < T(0) ? T(0) : t;
}

// Synchronized BatchNorm's exchange (kernels/batchnorm.h): the group and the workspace the exchange goes through,
// laid out as sync_floats says.
struct Sync {
  ProcessGroup* group = nullptr;  // null: this process's statistics
  float* ws = nullptr;
};

// Forward: this rank's (mean, M2, count) [3][C], then every rank's [W][3][C]; backward: the sums (S1, S2) [2][C].
size_t sync_floats(const BatchNormShape& s, int ranks) { return ranks > 1 ? size_t(3 * s.c * (ranks + 1)) : 0; }

// Channels c0 + j, j < cn: the two-pass mean and M2 = Σ(x - mean)².
template <class T>
void channel_moments(const BatchNormShape& s, const T* x, int64_t c0, int64_t cn, double* mean, double* m2) {
  const int64_t count = s.n * s.hw;
  for (int64_t j = 0; j < cn; ++j) mean[j] = 0.0, m2[j] = 0.0;
  for_each_element(s, c0, cn, [&](int64_t j, int64_t idx) { mean[j] += double(x[idx]); });
  for (int64_t j = 0; j < cn; ++j) mean[j] /= double(count);
  for_each_element(s, c0, cn, [&](int64_t j, int64_t idx) {
    const double d = double(x[idx]) - mean[j];
    m2[j] += d * d;
  });
}

template <class T>
void forward_train_impl(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const T* x, const T* gamma,
                        const T* beta, T* y, T* save_mean, T* save_invstd, T* running_mean, T* running_var,
                        int64_t* num_batches_tracked, const Sync& sync = {}) {
  const int64_t count = s.n * s.hw;
  if (count == 1)
    throw Error(cat("batchnorm_forward_train: expected more than 1 value per channel when training, got n=", s.n,
                    " hw=", s.hw));
  if (s.c == 0 || count == 0) return;
  const double elems = double(count) * double(s.c);
  const double m = h.momentum;
  // Channels c0 + j from their statistics over `total` values: save_*, running_* and y.
  auto normalize = [&](int64_t c0, int64_t cn, const double* mean, const double* m2, double total) {
    double scale[kGroup], shift[kGroup];
    for (int64_t j = 0; j < cn; ++j) {
      const int64_t c = c0 + j;
      const double var = m2[j] / total;
      const double invstd = 1.0 / std::sqrt(var + h.eps);
      save_mean[c] = static_cast<T>(mean[j]);
      save_invstd[c] = static_cast<T>(invstd);
      if (running_mean) running_mean[c] = static_cast<T>((1 - m) * double(running_mean[c]) + m * mean[j]);
      if (running_var)
        running_var[c] = static_cast<T>((1 - m) * double(running_var[c]) + m * var * total / (total - 1));
      scale[j] = invstd * (gamma ? double(gamma[c]) : 1.0);
      shift[j] = beta ? double(beta[c]) : 0.0;
    }
    if (h.relu)
      for_each_element(s, c0, cn, [&](int64_t j, int64_t idx) {
        y[idx] = relu_of<T>((double(x[idx]) - mean[j]) * scale[j] + shift[j]);
      });
    else
      for_each_element(s, c0, cn, [&](int64_t j, int64_t idx) {
        y[idx] = static_cast<T>((double(x[idx]) - mean[j]) * scale[j] + shift[j]);
      });
  };
  if (!sync.group) {
    OpScope scope(exec, "batchnorm_forward_train", profile::OpCost{elems * 3 * sizeof(T), elems * 8});
    for_channel_groups(exec, s, [&](int64_t c0, int64_t cn) {
      double mean[kGroup], m2[kGroup];
      channel_moments(s, x, c0, cn, mean, m2);
      normalize(c0, cn, mean, m2, double(count));
    });
  } else {
    // Each rank's (mean, M2, count) out as fp32, every rank's in, combined in rank order (Chan) in double.
    const int64_t C = s.c;
    const int world = sync.group->world();
    float* local = sync.ws;
    float* gathered = sync.ws + 3 * C;
    {
      OpScope scope(exec, "batchnorm_stats", profile::OpCost{elems * 2 * sizeof(T), elems * 3});
      for_channel_groups(exec, s, [&](int64_t c0, int64_t cn) {
        double mean[kGroup], m2[kGroup];
        channel_moments(s, x, c0, cn, mean, m2);
        for (int64_t j = 0; j < cn; ++j)
          local[c0 + j] = float(mean[j]), local[C + c0 + j] = float(m2[j]), local[2 * C + c0 + j] = float(count);
      });
    }
    sync.group->all_gather(exec, local, gathered, size_t(3 * C));
    OpScope scope(exec, "batchnorm_forward_train", profile::OpCost{elems * 2 * sizeof(T), elems * 5});
    for_channel_groups(exec, s, [&](int64_t c0, int64_t cn) {
      double mean[kGroup], m2[kGroup], n[kGroup] = {};
      for (int64_t j = 0; j < cn; ++j) {
        mean[j] = 0.0, m2[j] = 0.0;
        for (int r = 0; r < world; ++r) {
          const float* theirs = gathered + int64_t(r) * 3 * C;
          const double nb = theirs[2 * C + c0 + j], total = n[j] + nb, d = double(theirs[c0 + j]) - mean[j];
          mean[j] += d * nb / total;
          m2[j] += double(theirs[C + c0 + j]) + d * d * n[j] * nb / total;
          n[j] = total;
        }
      }
      normalize(c0, cn, mean, m2, double(count) * world);
    });
  }
  if (num_batches_tracked) *num_batches_tracked += 1;
}

template <class T>
void forward_eval_impl(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const T* x, const T* gamma,
                       const T* beta, const T* running_mean, const T* running_var, T* y) {
  const int64_t count = s.n * s.hw;
  if (s.c == 0 || count == 0) return;
  const double elems = double(count) * double(s.c);
  OpScope scope(exec, "batchnorm_forward_eval", profile::OpCost{elems * 2 * sizeof(T), elems * 2});
  for_channel_groups(exec, s, [&](int64_t c0, int64_t cn) {
    double center[kGroup], scale[kGroup], shift[kGroup];
    for (int64_t j = 0; j < cn; ++j) {
      const int64_t c = c0 + j;
      center[j] = double(running_mean[c]);
      scale[j] = (gamma ? double(gamma[c]) : 1.0) / std::sqrt(double(running_var[c]) + h.eps);
      shift[j] = beta ? double(beta[c]) : 0.0;
    }
    if (h.relu)
      for_each_element(s, c0, cn, [&](int64_t j, int64_t idx) {
        y[idx] = relu_of<T>((double(x[idx]) - center[j]) * scale[j] + shift[j]);
      });
    else
      for_each_element(s, c0, cn, [&](int64_t j, int64_t idx) {
        y[idx] = static_cast<T>((double(x[idx]) - center[j]) * scale[j] + shift[j]);
      });
  });
}

template <class T>
void backward_impl(const Exec& exec, const BatchNormShape& s, const BatchNormHyper& h, const T* x, const T* y,
                   const T* dy, const T* gamma, const T* save_mean, const T* save_invstd, T* dx, T* dgamma, T* dbeta,
                   const Sync& sync = {}) {
  const int64_t count = s.n * s.hw;
  if (s.c == 0 || count == 0 || (!dx && !dgamma && !dbeta)) return;
  const double elems = double(count) * double(s.c);
  const double passes = (h.relu ? 3 : 2) * (dx ? 2 : 1) + (dx ? 1 : 0);  // tensors read per pass, dx written
  const bool relu = h.relu;
  auto grad = [&](int64_t idx) { return relu ? (y[idx] > T(0) ? double(dy[idx]) : 0.0) : double(dy[idx]); };
  // Channels c0 + j: Σdy' and Σdy'·(x - mean).
  auto sums = [&](int64_t c0, int64_t cn, double* sum_dy, double* sum_dyx) {
    for (int64_t j = 0; j < cn; ++j) sum_dy[j] = 0.0, sum_dyx[j] = 0.0;
    for_each_element(s, c0, cn, [&](int64_t j, int64_t idx) {
      const double g = grad(idx);
      sum_dy[j] += g;
      sum_dyx[j] += g * (double(x[idx]) - double(save_mean[c0 + j]));
    });
  };
  // Channels c0 + j from their sums: dgamma, dbeta and dx.
  auto gradients = [&](int64_t c0, int64_t cn, const double* sum_dy, const double* sum_dyx) {
    double mean[kGroup], k1[kGroup], mdy[kGroup], a[kGroup];
    for (int64_t j = 0; j < cn; ++j) {
      const int64_t c = c0 + j;
      const double invstd = double(save_invstd[c]);
      const double sum_dyxhat = sum_dyx[j] * invstd;
      if (dgamma) dgamma[c] = static_cast<T>(sum_dyxhat);
      if (dbeta) dbeta[c] = static_cast<T>(sum_dy[j]);
      mean[j] = double(save_mean[c]);
      k1[j] = (gamma ? double(gamma[c]) : 1.0) * invstd;
      mdy[j] = sum_dy[j] / double(count);
      a[j] = invstd * sum_dyxhat / double(count);
    }
    if (dx)
      for_each_element(s, c0, cn, [&](int64_t j, int64_t idx) {
        dx[idx] = static_cast<T>(k1[j] * (grad(idx) - mdy[j] - (double(x[idx]) - mean[j]) * a[j]));
      });
  };
  if (!sync.group) {
    OpScope scope(exec, "batchnorm_backward", profile::OpCost{elems * passes * sizeof(T), elems * (dx ? 10 : 4)});
    for_channel_groups(exec, s, [&](int64_t c0, int64_t cn) {
      double sum_dy[kGroup], sum_dyx[kGroup];
      sums(c0, cn, sum_dy, sum_dyx);
      gradients(c0, cn, sum_dy, sum_dyx);
    });
    return;
  }
  // The sums out as fp32, the ranks' mean of them back (kernels/batchnorm.h, synchronized).
  const int64_t C = s.c;
  {
    OpScope scope(exec, "batchnorm_backward_reduce", profile::OpCost{elems * (relu ? 3 : 2) * sizeof(T), elems * 4});
    for_channel_groups(exec, s, [&](int64_t c0, int64_t cn) {
      double sum_dy[kGroup], sum_dyx[kGroup];
      sums(c0, cn, sum_dy, sum_dyx);
      for (int64_t j = 0; j < cn; ++j) sync.ws[c0 + j] = float(sum_dy[j]), sync.ws[C + c0 + j] = float(sum_dyx[j]);
    });
  }
  sync.group->all_reduce_mean(exec, sync.ws, size_t(2 * C));
  OpScope scope(exec, "batchnorm_backward", profile::OpCost{elems * (passes - (relu ? 3 : 2)) * sizeof(T), elems * 6});
  for_channel_groups(exec, s, [&](int64_t c0, int64_t cn) {
    double sum_dy[kGroup], sum_dyx[kGroup];
    for (int64_t j = 0; j < cn; ++j) sum_dy[j] = sync.ws[c0 + j], sum_dyx[j] = sync.ws[C + c0 + j];
    gradients(c0, cn, sum_dy, sum_dyx);
  });
}

Pool2dShape pool_shape(const BatchNormShape& s, const BatchNormPool& pool) {
  return {static_cast<int>(s.n), static_cast<int>(s.c), pool.h, pool.w, pool.window, pool.window};
}

template <class T>
void pool_forward_train_impl(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                             const BatchNormHyper& h, const T* x, const T* gamma, const T* beta, T* y, int32_t* argmax,
                             T* save_mean, T* save_invstd, T* running_mean, T* running_var,
                             int64_t* num_batches_tracked, T* workspace, const Sync& sync) {
  check_batchnorm_pool(s, pool);
  NT_CHECK(workspace != nullptr || s.n * s.hw * s.c == 0, "batchnorm_pool_forward_train needs its workspace");
  forward_train_impl(exec, s, h, x, gamma, beta, workspace, save_mean, save_invstd, running_mean, running_var,
                     num_batches_tracked, sync);
  cpu::maxpool2d_forward(exec,
                         MaxPool2dArgs<T>{.shape = pool_shape(s, pool), .x = workspace, .y = y, .argmax = argmax});
}

template <class T>
void pool_forward_eval_impl(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool,
                            const BatchNormHyper& h, const T* x, const T* gamma, const T* beta, const T* running_mean,
                            const T* running_var, T* y, int32_t* argmax, T* workspace) {
  check_batchnorm_pool(s, pool);
  NT_CHECK(workspace != nullptr || s.n * s.hw * s.c == 0, "batchnorm_pool_forward_eval needs its workspace");
  forward_eval_impl(exec, s, h, x, gamma, beta, running_mean, running_var, workspace);
  cpu::maxpool2d_forward(exec,
                         MaxPool2dArgs<T>{.shape = pool_shape(s, pool), .x = workspace, .y = y, .argmax = argmax});
}

template <class T>
void pool_backward_impl(const Exec& exec, const BatchNormShape& s, const BatchNormPool& pool, const BatchNormHyper& h,
                        const T* x, const T* y, const T* dy, int32_t* argmax, const T* gamma, const T* save_mean,
                        const T* save_invstd, T* dx, T* dgamma, T* dbeta, T* workspace, const Sync& sync) {
  check_batchnorm_pool(s, pool);
  const int64_t full = s.n * s.c * s.hw, pooled = s.n * s.c * pool.p() * pool.q();
  if (full == 0) return;
  NT_CHECK(workspace != nullptr, "batchnorm_pool_backward needs its workspace");
  NT_CHECK(!h.relu || y != nullptr, "batchnorm_pool_backward with relu needs the pooled forward output y");
  T* grad = workspace;           // (n, c, h, w): the BatchNorm's dy'
  T* masked = workspace + full;  // (n, c, P, Q): dy through the ReLU
  for (int64_t e = 0; e < pooled; ++e) masked[e] = h.relu && !(y[e] > 0) ? T(0) : dy[e];
  cpu::maxpool2d_backward(exec,
                          MaxPool2dArgs<T>{.shape = pool_shape(s, pool), .argmax = argmax, .dy = masked, .dx = grad});
  BatchNormHyper plain = h;
  plain.relu = false;
  backward_impl(exec, s, plain, x, static_cast<const T*>(nullptr), grad, gamma, save_mean, save_invstd, dx, dgamma,
                dbeta, sync);
}

// The pooled ops' scratch, then the synchronized exchange's floats.
int64_t pool_scratch(const BatchNormShape& s, const BatchNormPool& pool) {
  return s.n * s.c * (s.hw + int64_t(pool.p()) * pool.q());
}

// The exchange's floats of a synchronized call (f32 only: the exchange is fp32), at ws + offset.
template <class T>
Sync sync_for(const char* op, const BatchNormArgs<T>& a, int64_t offset) {
  if (!a.group || a.group->world() == 1) return {};
  if constexpr (!std::is_same_v<T, float>) {
    throw Error(cat(op, ": a synchronized batchnorm is f32"));
  } else {
    NT_CHECK(a.workspace != nullptr, op, ": synchronized, it needs batchnorm_workspace_floats(shape, ranks)");
    return {a.group, a.workspace + offset};
  }
}

}  // namespace

// given: statistics of x a producer already computed; the CPU computes its own (the same statistics). Only the f32
// GPU kernels give any, so in f64 they are an error.
template <class T>
void batchnorm_forward_train(const Exec& exec, const BatchNormArgs<T>& a) {
  if constexpr (!std::is_same_v<T, float>)
    NT_CHECK(a.given.chunks == 0, "batchnorm_forward_train: given statistics are f32");
  forward_train_impl(exec, a.shape, a.hyper, a.x, a.gamma, a.beta, a.y, a.save_mean, a.save_invstd, a.running_mean,
                     a.running_var, a.num_batches_tracked, sync_for("batchnorm_forward_train", a, 0));
}
template <class T>
void batchnorm_forward_eval(const Exec& exec, const BatchNormArgs<T>& a) {
  forward_eval_impl(exec, a.shape, a.hyper, a.x, a.gamma, a.beta, static_cast<const T*>(a.running_mean),
                    static_cast<const T*>(a.running_var), a.y);
}
template <class T>
void batchnorm_backward(const Exec& exec, const BatchNormArgs<T>& a) {
  backward_impl(exec, a.shape, a.hyper, a.x, static_cast<const T*>(a.y), a.dy, a.gamma,
                static_cast<const T*>(a.save_mean), static_cast<const T*>(a.save_invstd), a.dx, a.dgamma, a.dbeta,
                sync_for("batchnorm_backward", a, 0));
}

size_t batchnorm_workspace_floats(const BatchNormShape& s, int ranks) { return sync_floats(s, ranks); }

size_t batchnorm_pool_workspace_floats(const BatchNormShape& s, const BatchNormPool& pool, int ranks) {
  check_batchnorm_pool(s, pool);
  return static_cast<size_t>(pool_scratch(s, pool)) + sync_floats(s, ranks);
}

template <class T>
void batchnorm_pool_forward_train(const Exec& exec, const BatchNormArgs<T>& a) {  // given: as batchnorm_forward_train's
  if constexpr (!std::is_same_v<T, float>)
    NT_CHECK(a.given.chunks == 0, "batchnorm_pool_forward_train: given statistics are f32");
  pool_forward_train_impl(exec, a.shape, a.pool, a.hyper, a.x, a.gamma, a.beta, a.y, a.argmax, a.save_mean,
                          a.save_invstd, a.running_mean, a.running_var, a.num_batches_tracked, a.workspace,
                          sync_for("batchnorm_pool_forward_train", a, pool_scratch(a.shape, a.pool)));
}
template <class T>
void batchnorm_pool_forward_eval(const Exec& exec, const BatchNormArgs<T>& a) {
  pool_forward_eval_impl(exec, a.shape, a.pool, a.hyper, a.x, a.gamma, a.beta, static_cast<const T*>(a.running_mean),
                         static_cast<const T*>(a.running_var), a.y, a.argmax, a.workspace);
}
template <class T>
void batchnorm_pool_backward(const Exec& exec, const BatchNormArgs<T>& a) {
  // A staged dx (channels-last in TF32 or BF16, the GPU's form for a convolution before it): dx, then rounded into
  // place. Only tests ask the CPU for one (a model stages nothing on the CPU), so its scratch is allocated here.
  const BatchNormShape& s = a.shape;
  std::vector<T> unstaged(a.dx_staged ? size_t(s.n * s.c * s.hw) : 0);
  T* dx = a.dx_staged ? unstaged.data() : a.dx;
  pool_backward_impl(exec, s, a.pool, a.hyper, a.x, static_cast<const T*>(a.y), a.dy, a.argmax, a.gamma,
                     static_cast<const T*>(a.save_mean), static_cast<const T*>(a.save_invstd), dx, a.dgamma, a.dbeta,
                     a.workspace, sync_for("batchnorm_pool_backward", a, pool_scratch(s, a.pool)));
  if (a.dx_staged) stage_channels_last(dx, s.n, s.c, s.hw, exec.math, a.dx_staged);
}

template void batchnorm_forward_train(const Exec&, const BatchNormArgs<float>&);
template void batchnorm_forward_train(const Exec&, const BatchNormArgs<double>&);
template void batchnorm_forward_eval(const Exec&, const BatchNormArgs<float>&);
template void batchnorm_forward_eval(const Exec&, const BatchNormArgs<double>&);
template void batchnorm_backward(const Exec&, const BatchNormArgs<float>&);
template void batchnorm_backward(const Exec&, const BatchNormArgs<double>&);
template void batchnorm_pool_forward_train(const Exec&, const BatchNormArgs<float>&);
template void batchnorm_pool_forward_train(const Exec&, const BatchNormArgs<double>&);
template void batchnorm_pool_forward_eval(const Exec&, const BatchNormArgs<float>&);
template void batchnorm_pool_forward_eval(const Exec&, const BatchNormArgs<double>&);
template void batchnorm_pool_backward(const Exec&, const BatchNormArgs<float>&);
template void batchnorm_pool_backward(const Exec&, const BatchNormArgs<double>&);

}  // namespace nt::kernels::cpu
