// Torch-level helpers of binding.cpp (the CPU kernels' only torch code).
#pragma once

#include <torch/extension.h>

#include <optional>
#include <tuple>

#include "kernels.h"

namespace picasso {

DType dtype_of(const at::Tensor& t);
at::Tensor as_long(const at::Tensor& t);


}  // namespace picasso
