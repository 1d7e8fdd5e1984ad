// Torch-level entry points shared by binding.cpp (CPU, always built) and binding_cuda.cpp
// (compiled only when torch has CUDA). Without CUDA the cuda_ops stubs throw.
#pragma once

#include <torch/extension.h>

#include <optional>
#include <stdexcept>
#include <tuple>

#include "kernels.h"

namespace picasso {

DType dtype_of(const at::Tensor& t);
at::Tensor as_long(const at::Tensor& t);

namespace cuda_ops {
#ifdef PICASSO_WITH_CUDA
at::Tensor bag_forward(const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets, Pool mode,
                       const std::optional<at::Tensor>& psw);
std::tuple<at::Tensor, at::Tensor> bag_backward(const at::Tensor& grad, const at::Tensor& indices,
                                                const at::Tensor& offsets, Pool mode,
                                                const std::optional<at::Tensor>& psw);
std::tuple<at::Tensor, at::Tensor, at::Tensor> unique(const at::Tensor& ids);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> route_ids(
    const at::Tensor& ids, const std::optional<at::Tensor>& hot_map, int64_t num_owners);
void sparse_update(at::Tensor& weight, const std::optional<at::Tensor>& state, const at::Tensor& rows,
                   const at::Tensor& grads, Optim opt, double lr, double eps);
#else
[[noreturn]] inline void no_cuda() { throw std::runtime_error("picasso native: built without CUDA"); }
inline at::Tensor bag_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&, Pool,
                              const std::optional<at::Tensor>&) {
  no_cuda();
}
inline std::tuple<at::Tensor, at::Tensor> bag_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                       Pool, const std::optional<at::Tensor>&) {
  no_cuda();
}
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> unique(const at::Tensor&) { no_cuda(); }
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> route_ids(
    const at::Tensor&, const std::optional<at::Tensor>&, int64_t) {
  no_cuda();
}
inline void sparse_update(at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&,
                          Optim, double, double) {
  no_cuda();
}
#endif
}  // namespace cuda_ops

}  // namespace picasso
