// The C++ half of the "tpu" stand-in device (see README.md beside this file): PyTorch's PrivateUse1 backend
// implemented on host memory. Python renames PrivateUse1 to "tpu" and registers the device module.
//
// What is here:
//   - an allocator of host memory whose pointers belong to a PrivateUse1 device, with memory statistics per
//     device, and one of pinned host memory;
//   - a DeviceGuardImpl (current device per thread, like CUDA; one trivial stream per device);
//   - a generator per device whose state is its own: a private CPU generator that no CPU operator uses;
//   - the PrivateUse1 hooks (device count, generators, pinned memory, storage resize) that `torch.Generator`,
//     `torch.accelerator`, `Tensor.pin_memory` and `UntypedStorage.resize_` reach;
//   - the kernels every backend provides itself (allocation, views, copies, `set_`, `.item()`) and a boxed
//     fallback that runs every other operator on the CPU, with the device's generator for random operators;
//   - autocast for AutocastPrivateUse1 with CUDA's operator lists.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/csrc/Generator.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace tpu_standin {
namespace {

using c10::DeviceIndex;
constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;

// ------------------------------------------------------------------------------------------------ devices

std::atomic<DeviceIndex> g_device_count{1};
// set once the first default generator exists: the device count is fixed from then on
std::atomic<bool> g_generators_created{false};
thread_local DeviceIndex t_current_device = 0;

DeviceIndex device_count() {
  return g_device_count.load();
}

void check_index(DeviceIndex index) {
  TORCH_CHECK(
      index >= 0 && index < device_count(),
      "tpu stand-in: device index ", static_cast<int>(index), " is out of range, there are ",
      static_cast<int>(device_count()), " devices (install(device_count=...) or TPU_STANDIN_DEVICES)");
}

void set_device_count(int64_t count) {
  TORCH_CHECK(count >= 1 && count <= 64, "tpu stand-in: the device count must be in [1, 64], got ", count);
  TORCH_CHECK(
      !g_generators_created.load() || count == device_count(),
      "tpu stand-in: the device count is fixed once the devices are in use (", static_cast<int>(device_count()),
      "), cannot make it ", count);
  g_device_count.store(static_cast<DeviceIndex>(count));
}

DeviceIndex current_device() {
  return t_current_device;
}

void set_device(DeviceIndex index) {
  check_index(index);
  t_current_device = index;
}

DeviceIndex exchange_device(DeviceIndex index) {
  const DeviceIndex previous = t_current_device;
  if (index >= 0) {
    set_device(index);
  }
  return previous;
}

// ------------------------------------------------------------------------------------------------ memory

// A block of device memory: what its deleter needs to free it and count it out of its device's statistics.
struct Block {
  void* data;
  size_t nbytes;
  DeviceIndex device;
};

void free_block(void* context);

// Host memory, tagged with the current device (a tensor's device is its storage's), with the statistics of a device
// allocator (`torch.accelerator.memory_stats`, `memory_allocated`...): every block is allocated and freed at once,
// nothing is cached, so the reserved memory is the allocated memory.
struct HostAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const DeviceIndex device = current_device();
    void* data = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    count(device, nbytes, /*allocated=*/true);
    return {data, new Block{data, nbytes, device}, &free_block, c10::Device(kDevice, device)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  void free(Block* block) {
    count(block->device, block->nbytes, /*allocated=*/false);
    c10::free_cpu(block->data);
    delete block;
  }

  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(DeviceIndex device) override {
    check_index(device);
    const std::lock_guard<std::mutex> lock(mutex_);
    return stats_[device];
  }
  void resetAccumulatedStats(DeviceIndex device) override {
    check_index(device);
    const std::lock_guard<std::mutex> lock(mutex_);
    for_each_stat(stats_[device], [](c10::CachingAllocator::Stat& stat) { stat.reset_accumulated(); });
  }
  void resetPeakStats(DeviceIndex device) override {
    check_index(device);
    const std::lock_guard<std::mutex> lock(mutex_);
    for_each_stat(stats_[device], [](c10::CachingAllocator::Stat& stat) { stat.reset_peak(); });
  }

 private:
  static constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

  template <typename F>
  static void for_each_stat(c10::CachingDeviceAllocator::DeviceStats& stats, F f) {
    for (auto* array : {&stats.allocation, &stats.segment, &stats.active, &stats.allocated_bytes,
                        &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes}) {
      f((*array)[kAll]);
    }
  }

  void count(DeviceIndex device, size_t nbytes, bool allocated) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto& stats = stats_[device];
    for (auto* array : {&stats.allocation, &stats.segment, &stats.active}) {
      allocated ? (*array)[kAll].increase(1) : (*array)[kAll].decrease(1);
    }
    for (auto* array : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes}) {
      allocated ? (*array)[kAll].increase(nbytes) : (*array)[kAll].decrease(nbytes);
    }
  }

  std::mutex mutex_;
  std::array<c10::CachingDeviceAllocator::DeviceStats, 64> stats_;
};

// leaked on purpose: tensors that outlive static destruction still free through it
HostAllocator& host_allocator() {
  static auto* allocator = new HostAllocator();
  return *allocator;
}

void free_block(void* context) {
  host_allocator().free(static_cast<Block*>(context));
}

REGISTER_ALLOCATOR(kDevice, &host_allocator());

// Pinned memory, what `Tensor.pin_memory()` and `DataLoader(pin_memory=True)` ask the accelerator for: host memory
// whose pointers are remembered, so that `is_pinned()` tells it apart (leaked on purpose: it outlives every tensor).
std::mutex& pinned_mutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}

std::unordered_set<const void*>& pinned_pointers() {
  static auto* pointers = new std::unordered_set<const void*>();
  return *pointers;
}

void free_pinned(void* data) {
  {
    const std::lock_guard<std::mutex> lock(pinned_mutex());
    pinned_pointers().erase(data);
  }
  c10::free_cpu(data);
}

bool is_pinned(const void* data) {
  const std::lock_guard<std::mutex> lock(pinned_mutex());
  return pinned_pointers().count(data) > 0;
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    if (data != nullptr) {
      const std::lock_guard<std::mutex> lock(pinned_mutex());
      pinned_pointers().insert(data);
    }
    return {data, data, &free_pinned, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

PinnedAllocator g_pinned_allocator;

// ------------------------------------------------------------------------------------------------ device guard

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kDevice;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    return {kDevice, exchange_device(device.index())};
  }
  c10::Device getDevice() const override {
    return {kDevice, current_device()};
  }
  void setDevice(c10::Device device) const override {
    set_device(device.index());
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    t_current_device = device.index();
  }
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }
  // every kernel runs synchronously on the host: streams and devices are always idle
  bool queryStream(const c10::Stream&) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const DeviceIndex) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// ------------------------------------------------------------------------------------------------ generator

// A device generator whose state is a private CPU generator (the same Mersenne Twister as the CPU's): the CPU
// kernels of random operators draw from it when the fallback passes it in place of the device generator.
class DeviceGenerator final : public c10::GeneratorImpl {
 public:
  DeviceGenerator(DeviceIndex index, at::Generator host)
      : c10::GeneratorImpl(c10::Device(kDevice, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host_(std::move(host)) {}
  explicit DeviceGenerator(DeviceIndex index)
      : DeviceGenerator(index, at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)) {}

  static c10::DeviceType device_type() {
    return kDevice;
  }
  // the CPU generator that holds this generator's state
  const at::Generator& host() const {
    return host_;
  }

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(host_mutex());
    host_.set_current_seed(seed);
  }
  uint64_t current_seed() const override {
    return host_.current_seed();
  }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(host_mutex());
    return host_.seed();
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> lock(host_mutex());
    host_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    return host_.get_offset();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    std::lock_guard<std::mutex> lock(host_mutex());
    host_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> lock(host_mutex());
    return host_.unsafeGetGeneratorImpl()->get_state();
  }

 private:
  std::mutex& host_mutex() const {
    return host_.unsafeGetGeneratorImpl()->mutex_;
  }
  DeviceGenerator* clone_impl() const override {
    std::lock_guard<std::mutex> lock(host_mutex());
    return new DeviceGenerator(device_.index(), host_.clone());
  }

  at::Generator host_;
};

const at::Generator& default_generator(DeviceIndex index) {
  static std::once_flag created;
  static std::vector<at::Generator> generators;
  std::call_once(created, [] {
    g_generators_created.store(true);
    for (DeviceIndex i = 0; i < device_count(); ++i) {
      generators.push_back(at::make_generator<DeviceGenerator>(i));
    }
  });
  const DeviceIndex resolved = index < 0 ? current_device() : index;
  check_index(resolved);
  return generators[resolved];
}

// ------------------------------------------------------------------------------------------------ hooks

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return device_count() > 0;
  }
  bool hasPrimaryContext(DeviceIndex) const override {
    return true;
  }
  DeviceIndex deviceCount() const override {
    return device_count();
  }
  void setCurrentDevice(DeviceIndex index) const override {
    set_device(index);
  }
  DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  DeviceIndex exchangeDevice(DeviceIndex index) const override {
    return exchange_device(index);
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex index) const override {
    return exchange_device(index);
  }
  const at::Generator& getDefaultGenerator(DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }
  bool isPinnedPtr(const void* data) const override {
    return is_pinned(data);
  }
  at::Generator getNewGenerator(DeviceIndex index) const override {
    const DeviceIndex resolved = index < 0 ? current_device() : index;
    check_index(resolved);
    return at::make_generator<DeviceGenerator>(resolved);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    const c10::DeviceGuard guard(storage.device());
    at::native::resize_bytes_nocuda(storage, static_cast<int64_t>(nbytes));
  }
};

const bool g_hooks_registered [[maybe_unused]] = [] {
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  return true;
}();

// ------------------------------------------------------------------------------------------------ kernels

// A CPU tensor on the same memory as `tensor` (which may be a device tensor): the host can read device memory.
at::Tensor host_alias(const at::Tensor& tensor) {
  if (!tensor.is_privateuseone()) {
    return tensor;
  }
  return at::from_blob(tensor.data_ptr(), tensor.sizes(), tensor.strides(), tensor.options().device(at::kCPU));
}

at::Tensor empty_memory_format(
    c10::IntArrayRef size,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device,
    std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "tpu stand-in: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "tpu stand-in: only CPU tensors can be pinned");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(
      size, &host_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::dtype_or_default(dtype),
      memory_format);
}

at::Tensor empty_strided(
    c10::IntArrayRef size,
    c10::IntArrayRef stride,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device,
    std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided, "tpu stand-in: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "tpu stand-in: only CPU tensors can be pinned");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(
      size, stride, &host_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::dtype_or_default(dtype));
}

// Every copy that involves the device lands here (`copy_` sends them to `_copy_from`), dtype conversions too.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (self.numel() > 0) {
    host_alias(dst).copy_(host_alias(self), non_blocking);
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  return at::native::_local_scalar_dense_cpu(host_alias(self));
}

// The allocator gives memory of the current device: the kernels that allocate for an existing tensor make its
// device current first.
const at::Tensor& resize(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat> format) {
  const c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, format);
}

at::Tensor& set_empty(at::Tensor& self) {
  const c10::DeviceGuard guard(self.device());
  const c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &host_allocator(), /*resizable=*/true);
  return self.set_(storage, 0, {0}, {});
}

// Dropout has no generator argument: the CPU kernel would draw from the CPU's generator. The mask comes from
// `bernoulli_` on the device instead, as the CPU kernel computes it.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) {
    return {input, at::empty_like(input, input.options().dtype(at::kBool))};
  }
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1. - p;
  const double scale = keep == 0. ? 0. : 1. / keep;
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(keep);
  return {input.mul(mask).mul_(scale), mask};
}

// In an operator's arguments, the generator of the device (the one given, or the default of the device of the
// first device tensor) is replaced by the CPU generator that holds its state.
void pass_device_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const auto first = stack->size() - arguments.size();
  std::optional<DeviceIndex> device;
  for (size_t i = 0; i < arguments.size() && !device; ++i) {
    const c10::IValue& value = (*stack)[first + i];
    if (value.isTensor() && value.toTensor().is_privateuseone()) {
      device = value.toTensor().device().index();
    }
  }
  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::TypePtr type = arguments[i].type();
    if (const auto* optional = type->castRaw<c10::OptionalType>()) {
      type = optional->getElementType();
    }
    if (type->kind() != c10::TypeKind::GeneratorType) {
      continue;
    }
    c10::IValue& value = (*stack)[first + i];
    const at::Generator generator =
        value.isNone() ? default_generator(device.value_or(current_device())) : value.toGenerator();
    TORCH_CHECK(
        generator.device().type() == kDevice, op.schema().name(), ": expected a generator of the '",
        c10::DeviceTypeName(kDevice, /*lower_case=*/true), "' device, got one of '", generator.device().type(),
        "'");
    value = generator.get<DeviceGenerator>()->host();
  }
}

// Everything without a kernel of its own runs on the CPU: the device tensors are copied to the host, the CPU
// kernel runs, and the results (and mutated arguments) are copied back. A view operator has no meaning across
// that copy: one without a kernel here fails instead of returning a copy.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  pass_device_generators(op, stack);
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  // the device's memory is the host's: the CPU's metadata-only kernels apply as they are (they keep the
  // tensor's storage and dispatch keys, and allocate through the storage's allocator)
  m.impl("resize_", resize);
  m.impl("set_", set_empty);
  m.impl("set_.source_Storage", TORCH_FN(at::native::set_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(at::native::set_storage_cpu_));
  m.impl("set_.source_Tensor", TORCH_FN(at::native::set_tensor_));
  // the view operators that backends implement themselves (every other one is composite)
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("native_dropout", native_dropout);
  // PyTorch's default kernel for PrivateUse1 (CompositeExplicitAutogradNonFunctional) calls `mse_loss.out` with a
  // 0-dim output that the CPU kernel resizes with a deprecation warning: the CPU's functional kernel has none
  m.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

// ------------------------------------------------------------------------------------------------ autocast

// PyTorch registers no autocast kernels for PrivateUse1: these are CUDA's lists (matrix products and
// convolutions in the autocast dtype; reductions, norms, softmax and losses in float32; mixed inputs promoted).
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

// the lists' signatures name ATen's types unqualified
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define STANDIN_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define STANDIN_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define STANDIN_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define STANDIN_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(STANDIN_LOWER_PRECISION_FP)
  AT_FORALL_FP32(STANDIN_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(STANDIN_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(STANDIN_PROMOTE)
#undef STANDIN_LOWER_PRECISION_FP
#undef STANDIN_FP32
#undef STANDIN_FP32_SET_OPT_DTYPE
#undef STANDIN_PROMOTE
}

} // namespace
} // namespace tpu_standin

// ------------------------------------------------------------------------------------------------ Python

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace tpu_standin;
  m.def("set_device_count", &set_device_count, "Fix the number of devices (before the first use).");
  m.def("device_count", [] { return static_cast<int>(device_count()); });
  m.def("current_device", [] { return static_cast<int>(current_device()); });
  m.def("set_device", [](int index) { set_device(static_cast<DeviceIndex>(index)); });
  m.def(
      "exchange_device", [](int index) { return static_cast<int>(exchange_device(static_cast<DeviceIndex>(index))); },
      "Make `index` the current device (unless negative) and return the previous one.");
  m.def(
      "default_generator",
      [](int index) {
        return py::reinterpret_steal<py::object>(
            THPGenerator_initDefaultGenerator(default_generator(static_cast<DeviceIndex>(index))));
      },
      "The default generator of a device, as a torch.Generator.");
}
