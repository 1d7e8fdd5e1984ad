// Torch side of the CUDA kernels: argument checks, output allocation, the current stream and
// torch's caching allocator for temporaries. Compiled only when torch has CUDA (csrc/build.py).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <optional>
#include <tuple>

#include "binding.h"
#include "kernels.h"

namespace picasso {
namespace cuda_ops {
namespace {

void* alloc_on_stream(size_t bytes, void* ctx) {
  return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, *static_cast<cudaStream_t*>(ctx));
}
void release(void* ptr, void*) { c10::cuda::CUDACachingAllocator::raw_delete(ptr); }

// Device guard, current stream and an allocator bound to it, for one call.
struct Launch {
  c10::cuda::CUDAGuard guard;
  cudaStream_t stream;
  cuda::Allocator mem;
  explicit Launch(const at::Tensor& t)
      : guard(t.device()), stream(c10::cuda::getCurrentCUDAStream().stream()), mem{alloc_on_stream, release, &stream} {}
};

void same_device(const at::Tensor& a, const at::Tensor& b, const char* name) {
  TORCH_CHECK_VALUE(b.device() == a.device(), "picasso native: ", name, " is on ", b.device(), ", expected ",
                    a.device());
}

at::Tensor error_flag(const at::Tensor& like) {
  return at::full({1}, -1, like.options().dtype(at::kLong));
}

void throw_if_flagged(const at::Tensor& flag, const char* what) {
  const int64_t pos = flag.item<int64_t>();
  TORCH_CHECK_INDEX(pos < 0, "picasso native: ", what, " at position ", pos, " is out of range");
}

}  // namespace

at::Tensor bag_forward(const at::Tensor& weight_in, const at::Tensor& indices_in, const at::Tensor& offsets_in,
                       Pool mode, const std::optional<at::Tensor>& psw_in) {
  same_device(weight_in, indices_in, "indices");
  same_device(weight_in, offsets_in, "offsets");
  Launch launch(weight_in);
  const at::Tensor weight = weight_in.contiguous();
  const at::Tensor indices = as_long(indices_in), offsets = as_long(offsets_in);
  std::optional<at::Tensor> psw;
  if (psw_in) {
    same_device(weight_in, *psw_in, "per_sample_weights");
    psw = psw_in->contiguous();
  }
  const int64_t num_bags = offsets.numel() - 1;
  at::Tensor out = at::empty({num_bags, weight.size(1)}, weight.options());
  at::Tensor flag = error_flag(weight);
  cuda::bag_forward(dtype_of(weight), weight.data_ptr(), weight.size(0), weight.size(1), indices.data_ptr<int64_t>(),
                    offsets.data_ptr<int64_t>(), num_bags, mode, psw ? psw->data_ptr() : nullptr, out.data_ptr(),
                    flag.data_ptr<int64_t>(), launch.stream);
  throw_if_flagged(flag, "index");
  return out;
}

std::tuple<at::Tensor, at::Tensor> bag_backward(const at::Tensor& grad_in, const at::Tensor& indices_in,
                                                const at::Tensor& offsets_in, Pool mode,
                                                const std::optional<at::Tensor>& psw_in) {
  same_device(grad_in, indices_in, "indices");
  same_device(grad_in, offsets_in, "offsets");
  Launch launch(grad_in);
  const at::Tensor grad = grad_in.contiguous();
  const at::Tensor indices = as_long(indices_in), offsets = as_long(offsets_in);
  const int64_t num_bags = offsets.numel() - 1;
  const at::Tensor ends = at::stack({offsets[0], offsets[num_bags]}).cpu();
  const int64_t base = ends[0].item<int64_t>(), used = ends[1].item<int64_t>() - base;
  TORCH_CHECK_INDEX(base >= 0 && used >= 0 && base + used <= indices.numel(), "picasso native: offsets must lie in [0, ",
                    indices.numel(), "]");
  std::optional<at::Tensor> psw;
  if (psw_in) {
    same_device(grad_in, *psw_in, "per_sample_weights");
    psw = psw_in->contiguous().narrow(0, base, used);
  }
  at::Tensor rows = at::empty({used}, indices.options());
  at::Tensor grads = at::empty({used, grad.size(1)}, grad.options());
  const int64_t u = cuda::bag_backward(dtype_of(grad), grad.data_ptr(), grad.size(1),
                                       indices.data_ptr<int64_t>() + base, offsets.data_ptr<int64_t>(), num_bags, used,
                                       mode, psw ? psw->data_ptr() : nullptr, rows.data_ptr<int64_t>(),
                                       grads.data_ptr(), launch.mem, launch.stream);
  return {rows.narrow(0, 0, u), grads.narrow(0, 0, u)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique(const at::Tensor& ids_in) {
  Launch launch(ids_in);
  const at::Tensor ids = as_long(ids_in).reshape({-1});
  const int64_t n = ids.numel();
  at::Tensor uniq = at::empty({n}, ids.options());
  at::Tensor inverse = at::empty({n}, ids.options());
  at::Tensor counts = at::empty({n}, ids.options());
  const int64_t u = cuda::unique(ids.data_ptr<int64_t>(), n, uniq.data_ptr<int64_t>(), inverse.data_ptr<int64_t>(),
                                 counts.data_ptr<int64_t>(), launch.mem, launch.stream);
  return {uniq.narrow(0, 0, u).to(ids_in.scalar_type()), inverse.view(ids_in.sizes()), counts.narrow(0, 0, u)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> route_ids(
    const at::Tensor& ids_in, const std::optional<at::Tensor>& hot_map_in, int64_t num_owners) {
  Launch launch(ids_in);
  const at::Tensor ids = as_long(ids_in);
  std::optional<at::Tensor> hot_map;
  bool is_int32 = false;
  if (hot_map_in) {
    same_device(ids_in, *hot_map_in, "hot_map");
    is_int32 = hot_map_in->scalar_type() == at::kInt;
    hot_map = is_int32 ? hot_map_in->contiguous() : as_long(*hot_map_in);
  }
  const int64_t n = ids.numel();
  const auto opts = ids.options();
  at::Tensor hot_pos = at::empty({n}, opts), hot_slot = at::empty({n}, opts);
  at::Tensor cold_pos = at::empty({n}, opts), cold_local = at::empty({n}, opts);
  at::Tensor counts = at::empty({num_owners}, opts);
  const int64_t hot = cuda::route_ids(
      ids.data_ptr<int64_t>(), n, hot_map ? hot_map->data_ptr() : nullptr, is_int32, hot_map ? hot_map->numel() : 0,
      num_owners, hot_pos.data_ptr<int64_t>(), hot_slot.data_ptr<int64_t>(), cold_pos.data_ptr<int64_t>(),
      cold_local.data_ptr<int64_t>(), counts.data_ptr<int64_t>(), launch.mem, launch.stream);
  const int64_t cold = n - hot;
  return {hot_pos.narrow(0, 0, hot), hot_slot.narrow(0, 0, hot), cold_pos.narrow(0, 0, cold),
          cold_local.narrow(0, 0, cold).to(ids_in.scalar_type()), counts};
}

void sparse_update(at::Tensor& weight, const std::optional<at::Tensor>& state, const at::Tensor& rows_in,
                   const at::Tensor& grads_in, Optim opt, double lr, double eps) {
  same_device(weight, rows_in, "rows");
  same_device(weight, grads_in, "grads");
  if (state) same_device(weight, *state, "state");
  Launch launch(weight);
  const at::Tensor rows = as_long(rows_in), grads = grads_in.contiguous();
  cuda::sparse_update(dtype_of(weight), weight.data_ptr(), weight.size(0), weight.size(1),
                      opt == Optim::RowwiseAdagrad ? state->data_ptr() : nullptr, rows.data_ptr<int64_t>(),
                      rows.numel(), grads.data_ptr(), opt, lr, eps, launch.mem, launch.stream);
}

}  // namespace cuda_ops
}  // namespace picasso
