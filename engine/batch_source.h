// The data seam between the engine and data/ (the device-resident batcher implements it).
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace nt {

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual int64_t examples() const = 0;
  // Called once before each epoch's steps are enqueued (e.g. uploads this epoch's order).
  virtual void begin_epoch(const kernels::Exec& exec, int epoch) = 0;
  // Enqueues: x.rows(rows) and y.rows(rows) <- examples [first, first + rows) of this epoch's order.
  // Must not allocate or synchronize: it runs inside captured training steps. beside_previous: the work
  // enqueued just before is one kernel that reads and writes nothing the gather reads or writes (a
  // training step's optimizer update), so the gather may run beside it.
  virtual void gather(const kernels::Exec& exec, int64_t first, int rows, const Tensor& x, const Tensor& y,
                      bool beside_previous) = 0;
};

}  // namespace nt
