// PyTorch parity (the end-to-end golden test): from the same initial weights, in the same data order, in
// fp32, the engine's per-step training losses and its first gradients match PyTorch's.
//
// The reference comes from PyTorch on the GPU machine (bench/parity_reference.py) and is named by two
// environment variables; without them this test FAILS, saying how to make them, rather than passing
// silently:
//   build/nanotrain train --epochs 1 --seed 1 --init-out init.safetensors
//   python3 bench/parity_reference.py --init init.safetensors --out parity_ref.safetensors
//   NT_PARITY_INIT=init.safetensors NT_PARITY_REF=parity_ref.safetensors build/tests/nt_tests_cuda "[parity]"
// The reference's metadata fixes the run (seed of the data order, batch, lr, steps); the order is epoch
// 1 of the full MNIST train set, which bench/nt_order.py reproduces from the seed.
#include "test_support.h"

#include <cmath>
#include <cstdlib>

#include "engine/checkpoint.h"
#include "rig.h"

// The backend under test. A CPU-only machine may compile this file with -DNT_PARITY_DEVICE='"cpu"' into
// a CPU test binary to check the test itself against a CPU PyTorch reference.
#ifndef NT_PARITY_DEVICE
#define NT_PARITY_DEVICE "cuda"
#endif

using namespace nt;

namespace {

constexpr const char* kHowTo =
    "set NT_PARITY_INIT and NT_PARITY_REF: `nanotrain train --epochs 1 --seed 1 --init-out init.safetensors`, "
    "then `python3 bench/parity_reference.py --init init.safetensors --out parity_ref.safetensors` (PyTorch), "
    "then NT_PARITY_INIT=init.safetensors NT_PARITY_REF=parity_ref.safetensors";

std::string meta(const SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata().find(key);
  INFO(f.path() << ": metadata has no '" << key << "' (was it written by bench/parity_reference.py?)");
  REQUIRE(it != f.metadata().end());
  return it->second;
}

double l2_norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s);
}

double l2_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("from PyTorch's starting point and data order, the engine's losses and gradients are PyTorch's",
          "[cuda][parity]") {
  const char* init_path = std::getenv("NT_PARITY_INIT");
  const char* ref_path = std::getenv("NT_PARITY_REF");
  if (!init_path || !*init_path || !ref_path || !*ref_path) FAIL("no PyTorch reference: " << kHowTo);

  const auto reference = SafetensorsFile::read(ref_path);
  REQUIRE(meta(reference, "dataset") == "mnist");
  REQUIRE(std::stoll(meta(reference, "train_examples")) == test::mnist().train.count);  // the order is over all of it
  const int steps = std::stoi(meta(reference, "steps"));
  test::RigOptions o;
  o.device = NT_PARITY_DEVICE;
  o.model = meta(reference, "model");
  o.seed = std::stoull(meta(reference, "seed"));
  o.batch = std::stoi(meta(reference, "batch"));
  o.sgd = {std::stof(meta(reference, "lr")), 0.f, 0.f};
  test::Rig rig(test::mnist().train, o);
  load_safetensors(init_path, *rig.model, rig.ctx.exec());
  const std::vector<float> want_losses = reference.floats("loss");
  REQUIRE(want_losses.size() == static_cast<size_t>(steps));

  // The engine against itself: the same run on the CPU backend, whose sums run in other orders. Its distance
  // from the GPU run is reported with PyTorch's, as the scale of what fp32 summation order alone does here.
  test::RigOptions cpu_options = o;
  cpu_options.device = "cpu";
  test::Rig cpu_rig(test::mnist().train, cpu_options);
  load_safetensors(init_path, *cpu_rig.model, cpu_rig.ctx.exec());

  double worst_loss = 0, worst_backends = 0, worst_grad = 0;
  int worst_step = 0;
  for (int s = 0; s < steps; ++s) {
    const double got = rig.step(s);
    const double want = want_losses[static_cast<size_t>(s)];
    worst_backends = std::max(worst_backends, std::abs(cpu_rig.step(s) - got) / std::abs(got));
    // Both sides compute in fp32 with different summation orders. Over 200 free-running steps they part by up
    // to 4.9e-4 (step 151), and no formula is the cause: measured op by op on the H100 (2026-11-25,
    // bench/parity_ops.py, PyTorch 2.11 recomputing each op from the engine's own inputs), every op of the
    // engine is as close to float64 as PyTorch's (within 1.6e-7 relative, PyTorch's within 2.5e-7), with no
    // bias beyond 1.3e-8, and the SGD update is bit-identical. The drift is the run's own sensitivity to
    // rounding: PyTorch 2.11 on this GPU and on the CPU part by 3.7e-4 at step 200 themselves. So 1e-4 over
    // 200 free-running steps holds for no two fp32 implementations that sum in other orders; the bound is 1e-3,
    // an order below what a wrong kernel or data order causes (> 1e-2). Step 1's gradients, from identical
    // weights, are held to 1e-5 below, and the GPU-CPU test (test_training_cuda.cpp) holds the engine to 1e-4.
    const double rel = std::abs(got - want) / std::abs(want);
    if (rel > worst_loss) worst_loss = rel, worst_step = s + 1;
    INFO("step " << s + 1 << ": engine loss " << got << ", PyTorch loss " << want << " (engine GPU vs CPU so far "
                 << worst_backends << ")");
    REQUIRE(rel <= 1e-3);

    if (s == 0) {
      // Step 1 starts from identical weights and inputs, so gradients differ by summation order only:
      // ~sqrt(K)·eps relative (K <= 784), about 1e-6; the bound of 1e-5 in norm leaves 10x room.
      for (const auto& p : rig.model->params().params()) {
        const std::vector<float> g = p.grad.to_host<float>(rig.ctx.exec());
        const std::vector<float> want_g = reference.floats("grad." + p.name);
        REQUIRE(g.size() == want_g.size());
        const double grad_rel = l2_distance(g, want_g) / l2_norm(want_g);
        worst_grad = std::max(worst_grad, grad_rel);
        INFO("gradient of " << p.name << ": ||engine - torch|| / ||torch|| = " << grad_rel);
        CHECK(grad_rel <= 1e-5);
      }
    }
  }
  WARN(NT_PARITY_DEVICE << " vs PyTorch over " << steps << " steps: largest relative loss difference " << worst_loss
                        << " (step " << worst_step << "; engine GPU against CPU: " << worst_backends
                        << "), largest relative gradient difference at step 1 " << worst_grad);
}
