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
//   dW[l] = d[l]ᵀ·a[l-1]    db[l] = Σ_b d[l]  then every W[l], b[l] takes the step of kernels/optim.h's SGD (PyTorch's:
//   weight decay, momentum without dampening) or Adam/AdamW (AdamElementStep), each of the step's gradients from the
//   weights before the step.
//
// The batch is cut into `groups` groups of consecutive rows, chunk = ceil(B / groups) rows each (the last may have
// fewer, none is empty): on the GPU each group is one cluster of blocks with a whole copy of the weights.
//
// Every sum has one order, written once in kernels/persistent_mlp_math.h and used by both backends:
//   a dot product over k (forward, and the input gradient over the next layer's outputs): dot16's sixteen chains, or
//     dot4's four for the head's short columns;
//   a sum over the batch (weight and bias gradients): one chain in increasing b within each group, then the groups'
//     sums in increasing group, left to right (with one group: one chain in increasing b);
//   the softmax row: the classes in increasing order (kernels/softmax_xent.h's arithmetic).
// Each multiply-add is one correctly rounded FMA on both backends, so the CPU twin (kernels/cpu/persistent_mlp.cpp)
// and the GPU agree bit for bit (e^x by exp_rn, the same bits on both) but for the loss value, which takes logf, and
// the GPU is bit-reproducible.
// *loss_sum += Σ_b loss_b (in double, b increasing, each step's batch in turn) and *correct += the argmax hits.
//
// On the GPU (kernels/cuda/persistent_mlp.cu; docs/persistent-mlp.md, design B) a cluster of blocks runs each group
// through every layer, its blocks exchanging activations under cluster barriers; once a step the groups' gradients
// are summed and every weight takes its step, between two grid barriers. It runs on sm_90 where a cluster's share of
// the weights and a group's staging fit its blocks' shared memory, with every cluster resident (persistent_mlp_groups);
// elsewhere the engine keeps the per-kernel path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/batch.h"
#include "kernels/dispatch.h"
#include "kernels/optim.h"

namespace nt::kernels {

inline constexpr int kPersistentMaxLayers = 4;    // Linear layers, the head included
inline constexpr int kPersistentMaxClasses = 32;  // the head's outputs
inline constexpr int kPersistentMaxBatch = 256;
inline constexpr int kPersistentMaxGroups = 16;  // clusters: the sum over groups loads one partial of each at once

struct PersistentMlpArgs {
  BatchSource src;                           // the data set and its normalization; shift and flip must be off
  int64_t first = 0;                         // the first step's first position in src.perm
  int steps = 0;                             // batches, one SGD step each
  int B = 0;                                 // rows of a batch, [1, kPersistentMaxBatch]
  int groups = 1;                            // [1, B], with no empty group (above): cuda::persistent_mlp_groups
  int layers = 0;                            // [2, kPersistentMaxLayers]
  int width[kPersistentMaxLayers + 1] = {};  // width[0] = src.D, width[layers] = classes
  // Layer l: weight (width[l+1], width[l]) row-major, bias (width[l+1]); read, then written with the last step's
  // values. The velocities (same shapes) likewise when momentum != 0, else unused (may be nullptr).
  float* weight[kPersistentMaxLayers] = {};
  float* bias[kPersistentMaxLayers] = {};
  float* weight_velocity[kPersistentMaxLayers] = {};
  float* bias_velocity[kPersistentMaxLayers] = {};
  float lr = 0.f, momentum = 0.f, weight_decay = 0.f;  // SGD's (kernels/optim.h)
  const float* lr_scale = nullptr;  // nullable, on the executing backend: lr · *lr_scale (the schedule's factor)
  // Adam / AdamW instead of SGD where adam_step is set: adam's hyperparameters (its own lr_scale unused: the one
  // above applies) and kernels/optim.h's step counter {value, done}, the first step's t = value + 1, value left at the
  // last step's t (done untouched). The velocities above are then the first moments, second_moment the second (same
  // shapes); lr, momentum and weight_decay above are unused.
  uint64_t* adam_step = nullptr;
  AdamHyper adam;
  float* weight_second_moment[kPersistentMaxLayers] = {};
  float* bias_second_moment[kPersistentMaxLayers] = {};
  double* loss_sum = nullptr;  // (1) accumulated
  int64_t* correct = nullptr;  // (1) accumulated
  // persistent_mlp_workspace_bytes(...) bytes on the executing backend, 256-byte aligned: the activations and their
  // gradients, which a cluster's blocks exchange through L2, the groups' gradients, the rows' losses, and the grid
  // barrier's two words. Zeroed once when planned: the barrier leaves its words ready for the next launch. The CPU
  // twin does not use it.
  void* workspace = nullptr;
};

// The op's own invariants (sizes, pointers, no augmentation), checked by both backends: nt::InternalError naming what
// is wrong (the caller's bug: the engine chooses the op only where it serves the model).
void check_persistent_mlp(const PersistentMlpArgs& a);

// Where the workspace's parts lie, from `base` (nullptr: offsets only): the grid barrier's two words; for each hidden
// layer l its output and the gradient there, (B, width[l+1]) floats each; the rows' losses and hits (B floats each);
// then the groups' gradients, one partial of every parameter a group: layer l's weights (width[l+1], width[l]) then
// its biases (width[l+1]) from layer_offset[l], a multiple of 4 floats. Every part 256-byte aligned.
struct PersistentMlpWorkspace {
  unsigned int* barrier = nullptr;               // count, generation (kernels/cuda/grid_barrier.cuh)
  float* activation[kPersistentMaxLayers] = {};  // [l]: layer l's input, for l >= 1 (hidden layer l-1's output)
  float* gradient[kPersistentMaxLayers] = {};    // [l]: the gradient at hidden layer l's output
  float* row_loss = nullptr;                     // (B) each row's loss
  float* row_hit = nullptr;                      // (B) 1 where the row's argmax is its label, else 0
  float* partial = nullptr;                      // (groups, partial_stride)
  size_t partial_stride = 0;                     // floats of one group's partial (a multiple of 64)
  size_t layer_offset[kPersistentMaxLayers] = {};
  size_t bytes = 0;  // the whole workspace
};
PersistentMlpWorkspace persistent_mlp_workspace(void* base, const int* width, int layers, int B, int groups);
inline size_t persistent_mlp_workspace_bytes(const int* width, int layers, int B, int groups) {
  return persistent_mlp_workspace(nullptr, width, layers, B, groups).bytes;
}
// Rows in each of the batch's groups but the last (above).
inline int persistent_mlp_chunk(int B, int groups) { return (B + groups - 1) / groups; }

namespace cpu {
void persistent_mlp(const Exec& exec, const PersistentMlpArgs& a);
}
namespace cuda {
void persistent_mlp(const Exec& exec, const PersistentMlpArgs& a);
// The groups the current device runs this model and batch in: as many as it holds clusters of the kernel at once, up to
// kPersistentMaxGroups and B, fewer where the last would be empty; 0 where none fits (not sm_90 code, or a cluster's
// share of the weights beyond its blocks' shared memory). Always 0 in a build without the CUDA backend's kernel.
int persistent_mlp_groups(const int* width, int layers, int B);
inline bool persistent_mlp_fits(const int* width, int layers, int B) {
  return persistent_mlp_groups(width, layers, B) > 0;
}
}  // namespace cuda
inline void persistent_mlp(const Exec& exec, const PersistentMlpArgs& a) {
  dispatch<cpu::persistent_mlp, cuda::persistent_mlp>(exec, a);
}

}  // namespace nt::kernels
