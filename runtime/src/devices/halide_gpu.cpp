// Halide's device interface as the memory primitives of a GPU backend.
#include "devices/halide_gpu.hpp"

#include "devices/gpu_memory.hpp"
#include "kernels/kernel_call.hpp"
#include "opforge/error.hpp"

namespace opforge::detail {

HalideGpuBackend::HalideGpuBackend(DeviceInfo info, const halide_device_interface_t* iface)
    : GpuBackend(std::move(info)), iface_(iface) {
  memory_ = std::make_unique<DeviceMemory>(*this);
}

bool HalideGpuBackend::allocate(DeviceBlock& b) {
  byte_buffer(b.buf, b.dim, b.capacity);
  if (halide_device_malloc(&context_, &b.buf, iface_) != 0) return false;
  b.raw = native(b.buf);
  return true;
}

void HalideGpuBackend::free(DeviceBlock& b) { halide_device_free(&context_, &b.buf); }

bool HalideGpuBackend::bind(halide_buffer_t& buf, const DeviceBlock& b, size_t offset,
                            DeviceHandle& h) const {
  if (!point(buf, b.raw, offset, h, true)) return false;
  buf.device_interface = iface_;
  return true;
}

void HalideGpuBackend::transfer(halide_buffer_t& hb, const DeviceBlock& b, bool to_device,
                                size_t bytes) {
  DeviceHandle h;
  point(hb, b.raw, 0, h, false);
  hb.device_interface = iface_;
  take_halide_error();
  int rc;
  if (to_device) {
    hb.set_host_dirty(true);
    rc = halide_copy_to_device(&context_, &hb, iface_);
  } else {
    hb.set_device_dirty(true);
    rc = halide_copy_to_host(&context_, &hb);
  }
  OPFORGE_CHECK(rc == 0) << device().str() << ": copying " << bytes << " bytes "
                         << (to_device ? "to" : "from")
                         << " the device failed: " << take_halide_error();
}

void HalideGpuBackend::upload(DeviceBlock& b, const void* src, size_t bytes) {
  halide_buffer_t hb{};
  halide_dimension_t dim{};
  byte_buffer(hb, dim, bytes);
  hb.host = static_cast<uint8_t*>(const_cast<void*>(src));
  transfer(hb, b, true, bytes);
}

void HalideGpuBackend::download(const DeviceBlock& b, void* dst, size_t bytes) {
  halide_buffer_t hb{};
  halide_dimension_t dim{};
  byte_buffer(hb, dim, bytes);
  hb.host = static_cast<uint8_t*>(dst);
  transfer(hb, b, false, bytes);
}

void HalideGpuBackend::copy(const DeviceBlock& src, size_t src_offset, DeviceBlock& dst,
                            size_t dst_offset, size_t n) {
  halide_buffer_t s{}, d{};
  halide_dimension_t sd{}, dd{};
  byte_buffer(s, sd, n);
  byte_buffer(d, dd, n);
  DeviceHandle sh, dh;
  point(s, src.raw, src_offset, sh, false);
  point(d, dst.raw, dst_offset, dh, false);
  s.device_interface = d.device_interface = iface_;
  take_halide_error();
  OPFORGE_CHECK(halide_buffer_copy(&context_, &s, iface_, &d) == 0)
      << device().str() << ": copying " << n
      << " bytes on the device failed: " << take_halide_error();
}

void HalideGpuBackend::sync_all() {
  // Halide 14's OpenCL and CUDA syncs finish the device's whole queue or stream, but want a buffer
  // that lives there: a one-byte one of its own, outside the allocator's figures.
  std::call_once(fence_once_, [&] {
    byte_buffer(fence_.buf, fence_.dim, 1);
    take_halide_error();
    fence_ok_ = halide_device_malloc(&context_, &fence_.buf, iface_) == 0;
  });
  OPFORGE_CHECK(fence_ok_) << device().str()
                           << ": cannot allocate the byte that waiting for the device needs: "
                           << take_halide_error();
  take_halide_error();
  OPFORGE_CHECK(halide_device_sync(&context_, &fence_.buf) == 0)
      << device().str() << ": waiting for the device failed: " << take_halide_error();
}

}  // namespace opforge::detail
