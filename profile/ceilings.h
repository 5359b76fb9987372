// A GPU's measured ceilings: the peak rates its memory and arithmetic units reach on simple, saturating loops, so
// that a profile can show each kernel's GB/s and GFLOP/s as a share of what this very machine can do.
//
// `nanotrain devices --measure` runs the loops (kernels/ceilings.h; the method and its reasoning are at the top of
// kernels/cuda/ceilings.cu) and keeps one entry per GPU, keyed by its UUID, in a small JSON cache:
//
//   {"version": 1, "devices": {"GPU-5f8a...": {"uuid": "GPU-5f8a...", "device": "NVIDIA H100 80GB HBM3",
//                                              "copy_gb_per_s": 2951.3, "fp32_gflop_per_s": 61234.5,
//                                              "tf32_gflop_per_s": ..., "bf16_gflop_per_s": ...,
//                                              "measured_at": "2026-11-26T14:03:12Z", "method": "..."}}}
//
// This file reads and writes that cache; it knows nothing of CUDA.
#pragma once

#include <optional>
#include <string>

namespace nt::profile {

struct Ceilings {               // one GPU's measured peak rates
  std::string uuid;             // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (as nvidia-smi -L), the cache key
  std::string device;           // e.g. "NVIDIA H100 80GB HBM3"
  double copy_gb_per_s = 0;     // device-to-device copy, (bytes read + bytes written) / s / 1e9
  double fp32_gflop_per_s = 0;  // FFMA loop, 2 flops per FMA
  double tf32_gflop_per_s = 0;  // mma.sync m16n8k8 TF32 loop; 0 where not measured (below sm_80)
  double bf16_gflop_per_s = 0;  // mma.sync m16n8k16 BF16 loop; 0 where not measured
  std::string measured_at;      // UTC, ISO 8601: "2026-11-26T14:03:12Z"
  std::string method;           // one line saying what was run (sizes, repetitions, median)
};

// $NT_CACHE_DIR/ceilings.json if NT_CACHE_DIR is set (and not empty), else $XDG_CACHE_HOME/nanotrain/ceilings.json
// (an absolute XDG_CACHE_HOME only, as the XDG specification asks), else $HOME/.cache/nanotrain/ceilings.json.
// Throws nt::Error when none of the three is set.
std::string ceilings_cache_path();

// The cached entry for this uuid, or nullopt when the file or the entry is absent. A file that is not valid JSON
// or has the wrong shape (any entry, not only this uuid's) throws nt::Error, one line naming the file (the caller
// decides whether to warn or stop). load_ceilings(path, "") thus checks a file without looking anything up.
std::optional<Ceilings> load_ceilings(const std::string& path, const std::string& uuid);

// Adds or replaces this uuid's entry, keeping the others; creates the folder; writes atomically (core/atomic_file.h).
// An existing file that load_ceilings would refuse is not overwritten: the nt::Error is thrown (a caller that has
// told the user removes the file first).
void store_ceilings(const std::string& path, const Ceilings& c);

// One line: "copy 2951 GB/s, fp32 61.2 TFLOP/s, tf32 ... TFLOP/s, bf16 ... TFLOP/s (measured 2026-11-26)"; a rate not
// measured reads "tf32 not measured".
std::string describe(const Ceilings& c);

}  // namespace nt::profile
