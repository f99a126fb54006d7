// The device-memory primitives of GPU kinds whose kernels Halide generated, through Halide's device
// interface (halide_device_malloc, halide_buffer_copy, halide_device_sync): the same code serves
// OpenCL and CUDA, and the kernels take the blocks as they are. A kind supplies the interface, the
// user context that selects its device, and how a buffer's `device` field names a byte of a block.
#pragma once
#include <mutex>

#include "devices/backend.hpp"

namespace opforge::detail {

class HalideGpuBackend : public GpuBackend {
 public:
  HalideGpuBackend(DeviceInfo info, const halide_device_interface_t* iface);
  UserContext* user_context() override { return &context_; }

  bool allocate(DeviceBlock& b) override;
  void free(DeviceBlock& b) override;
  void upload(DeviceBlock& b, const void* src, size_t bytes) override;
  void download(const DeviceBlock& b, void* dst, size_t bytes) override;
  void copy(const DeviceBlock& src, size_t src_offset, DeviceBlock& dst, size_t dst_offset,
            size_t n) override;
  bool bind(halide_buffer_t& buf, const DeviceBlock& b, size_t offset,
            DeviceHandle& h) const override;
  void sync_all() override;

 protected:
  // The native handle (cl_mem, CUdeviceptr) of a buffer halide_device_malloc filled.
  virtual uint64_t native(const halide_buffer_t& allocated) const = 0;
  // Sets buf.device to byte `offset` of the block whose native handle is `raw`, using `h` if the
  // kind's handle needs room. `kernel`: for a kernel argument, which may refuse offsets the device
  // cannot address in place (false); copies take any offset.
  virtual bool point(halide_buffer_t& buf, uint64_t raw, size_t offset, DeviceHandle& h,
                     bool kernel) const = 0;
  UserContext context_;
  const halide_device_interface_t* iface_;

 private:
  void transfer(halide_buffer_t& host_side, const DeviceBlock& b, bool to_device, size_t bytes);
  std::once_flag fence_once_;
  DeviceBlock fence_;  // what sync_all() names the device by
  bool fence_ok_ = false;
};

}  // namespace opforge::detail
