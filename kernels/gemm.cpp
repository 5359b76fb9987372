#include "kernels/gemm.h"

namespace nt::kernels {

const char* gemm_kernel_name(Epilogue e) {
  switch (e) {
    case Epilogue::none:
      return "gemm";
    case Epilogue::bias:
      return "gemm_bias";
    case Epilogue::bias_relu:
      return "gemm_bias_relu";
    case Epilogue::relu_mask:
      return "gemm_relu_mask";
  }
  return "gemm";
}

}  // namespace nt::kernels
