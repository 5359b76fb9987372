// Helpers that the CUDA tests of the BatchNorm family (tests/cuda/test_batchnorm_cuda.cpp) and of the fused
// convolution stem (tests/cuda/test_conv_batchnorm_pool_cuda.cpp) share: a BatchNorm's inputs and the CPU twin's
// results, the pooled CPU twin, y's tolerances and the check of the GPU's max-pool choices.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/batchnorm.h"
#include "test_support.h"

namespace nt::test {

// The BatchNorm vocabulary of these helpers and of the tests that include them.
using kernels::Backend;
using kernels::BatchNormHyper;
using kernels::BatchNormShape;
using kernels::Exec;

double max_abs(const std::vector<float>& v);

struct Inputs {
  std::vector<float> x, gamma, beta, rm, rv, dy;  // gamma/beta empty: affine = false
};

Inputs make_inputs(const BatchNormShape& s, bool affine, float lo = -1, float hi = 1);

struct Results {
  std::vector<float> y, mean, invstd, rm, rv, y_eval, dx, dgamma, dbeta;
  int64_t batches = 0;
};

const float* ptr_or_null(const std::vector<float>& v);

struct PoolResults {
  Results r;  // y, y_eval: pooled; dx: full resolution
  std::vector<int32_t> argmax, argmax_eval;
};

// The pooled CPU twin: batchnorm_pool_forward_train, forward_eval from the updated running statistics, backward
// from the pooled dy.
PoolResults run_cpu_pool(const BatchNormShape& s, const kernels::BatchNormPool& pool, const BatchNormHyper& h,
                         const Inputs& in, const std::vector<float>& dy);

double output_scale(const BatchNormShape& s, const Inputs& in, const Results& cpu);  // max |gamma·invstd|

// y = (x - mean)·scale + beta: the mean's absolute error times invstd plus xhat times the scale's relative error:
// 3e-5 of max|y| (+ the mean term). Evaluation applies given statistics with one fp32 fma.
Tolerance train_y_tolerance(double scale, double x_unit);
Tolerance eval_y_tolerance(double scale, double x_unit);

// Checks the GPU's argmax choices (training and eval) against the CPU's full-resolution BatchNorm outputs of
// in.x with the statistics the CPU twin computed: each choice must be its window's maximum within twice the
// pooled y's tolerance.
void check_choices(const BatchNormShape& s, const kernels::BatchNormPool& pool, const BatchNormHyper& h,
                   const Inputs& in, const PoolResults& cpu, const PoolResults& gpu, const Tolerance& y_tol,
                   const Tolerance& eval_tol);

}  // namespace nt::test
