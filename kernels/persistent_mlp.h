// The persistent mlp step: many SGD training steps of an MLP as one op, on the GPU one cooperative launch whose blocks
// keep the weights in shared memory from the first step to the last (docs/persistent-mlp.md).
//
// The model: `layers` Linear layers of widths w[0] -> w[1] -> ... -> w[layers] (w[0] = src.D, the last layer the
// head of w[layers] = C classes), ReLU after every layer but the head, softmax cross-entropy on the head's logits.
// Step s (s in [0, steps)) trains on the batch at positions first + s·B ... of src.perm, gathered and normalized as
// kernels/batch.h does (no shift or flip):
//
//   a[-1] = x (B, w[0])                       a[l] = relu(a[l-1]·W[l]ᵀ + b[l])  (B, w[l+1]),  l < layers - 1
//   logits = a[L-2]·W[L-1]ᵀ + b[L-1]          loss, correct, dlogits = (softmax - onehot) / B  (kernels/softmax_xent.h)
//   d[L-1] = dlogits                          d[l-1] = (d[l]·W[l]) ⊙ (a[l-1] > 0)
//   dW[l] = d[l]ᵀ·a[l-1]    db[l] = Σ_b d[l]  then every W[l], b[l] takes the SGD step of kernels/optim.h (PyTorch's:
//   weight decay, momentum without dampening), each of the step's gradients from the weights before the step.
//
// Every sum has one order, written once in kernels/persistent_mlp_math.h and used by both backends:
//   a dot product over k (forward, and the input gradient over the next layer's outputs): four partial chains by
//     k mod 4, each in increasing k, then (p0 + p1) + (p2 + p3);
//   a sum over the batch (weight and bias gradients): one chain in increasing b;
//   the softmax row: the classes in increasing order (kernels/softmax_xent.h's arithmetic).
// Each multiply-add is one correctly rounded FMA on both backends, so the CPU twin (kernels/cpu/persistent_mlp.cpp)
// and the GPU agree bit for bit (e^x by exp_rn, the same bits on both) but for the loss value, which takes logf, and
// the GPU is bit-reproducible.
// *loss_sum += Σ_b loss_b (in double, b increasing, each step's batch in turn) and *correct += the argmax hits.
//
// On the GPU (kernels/cuda/persistent_mlp.cu) each block owns a slice of every hidden layer's neurons: their weight
// rows, and the matching columns of the next layer's weights (a second copy, updated by the same arithmetic, so the
// two stay equal); every block holds the whole head. The phases of a step are separated by grid barriers: one after
// each hidden layer's forward, one after the head's backward and one after each hidden layer's backward but the last
// (2·layers - 3 a step; 2 with a single hidden layer, whose next forward overwrites what the head reads). It runs
// where the weights and a batch's staging fit one block's shared memory, with every block resident
// (persistent_mlp_fits); elsewhere the engine keeps the per-kernel path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/batch.h"
#include "kernels/dispatch.h"

namespace nt::kernels {

inline constexpr int kPersistentMaxLayers = 4;    // Linear layers, the head included
inline constexpr int kPersistentMaxClasses = 32;  // the head's outputs
inline constexpr int kPersistentMaxBatch = 256;

struct PersistentMlpArgs {
  BatchSource src;                           // the data set and its normalization; shift and flip must be off
  int64_t first = 0;                         // the first step's first position in src.perm
  int steps = 0;                             // batches, one SGD step each
  int B = 0;                                 // rows of a batch, [1, kPersistentMaxBatch]
  int layers = 0;                            // [2, kPersistentMaxLayers]
  int width[kPersistentMaxLayers + 1] = {};  // width[0] = src.D, width[layers] = classes
  // Layer l: weight (width[l+1], width[l]) row-major, bias (width[l+1]); read, then written with the last step's
  // values. The velocities (same shapes) likewise when momentum != 0, else unused (may be nullptr).
  float* weight[kPersistentMaxLayers] = {};
  float* bias[kPersistentMaxLayers] = {};
  float* weight_velocity[kPersistentMaxLayers] = {};
  float* bias_velocity[kPersistentMaxLayers] = {};
  float lr = 0.f, momentum = 0.f, weight_decay = 0.f;
  const float* lr_scale = nullptr;  // nullable, on the executing backend: lr · *lr_scale (the schedule's factor)
  double* loss_sum = nullptr;       // (1) accumulated
  int64_t* correct = nullptr;       // (1) accumulated
  // persistent_mlp_workspace_bytes(...) bytes on the executing backend, 256-byte aligned: the activations and their
  // gradients, which the blocks exchange through L2, and the grid barrier's two words. Zeroed once when planned:
  // the barrier leaves its words ready for the next launch.
  void* workspace = nullptr;
};

// The op's own invariants (sizes, pointers, no augmentation), checked by both backends: nt::InternalError naming what
// is wrong (the caller's bug: the engine chooses the op only where it serves the model).
void check_persistent_mlp(const PersistentMlpArgs& a);

// Where the workspace's parts lie, from `base` (nullptr: offsets only): the grid barrier's two words, then for each
// hidden layer l its output and the gradient there, (B, width[l+1]) floats each, every part 256-byte aligned.
struct PersistentMlpWorkspace {
  unsigned int* barrier = nullptr;               // count, generation (kernels/cuda/grid_barrier.cuh)
  float* activation[kPersistentMaxLayers] = {};  // [l]: layer l's input, for l >= 1 (hidden layer l-1's output)
  float* gradient[kPersistentMaxLayers] = {};    // [l]: the gradient at hidden layer l's output
  size_t bytes = 0;                              // the whole workspace
};
PersistentMlpWorkspace persistent_mlp_workspace(void* base, const int* width, int layers, int B);
inline size_t persistent_mlp_workspace_bytes(const int* width, int layers, int B) {
  return persistent_mlp_workspace(nullptr, width, layers, B).bytes;
}

namespace cpu {
void persistent_mlp(const Exec& exec, const PersistentMlpArgs& a);
}
namespace cuda {
void persistent_mlp(const Exec& exec, const PersistentMlpArgs& a);
// Whether the current device runs the kernel for this model and batch: sm_90 or sm_80 code, the block's weights and
// staging within its shared memory, one block per SM resident. False in a build without the CUDA backend's kernel.
bool persistent_mlp_fits(const int* width, int layers, int B);
}  // namespace cuda
inline void persistent_mlp(const Exec& exec, const PersistentMlpArgs& a) {
  dispatch<cpu::persistent_mlp, cuda::persistent_mlp>(exec, a);
}

}  // namespace nt::kernels
