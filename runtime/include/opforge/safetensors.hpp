// Named tensors in the safetensors format (Hugging Face's, which PyTorch's `safetensors.torch`
// reads and writes): an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the tensors' little-endian bytes. Weights and optimiser state
// are saved this way, so a file opforge writes loads in PyTorch and the reverse.
#pragma once
#include <map>
#include <string>

#include "opforge/tensor.hpp"

namespace opforge {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;        // by name
  std::map<std::string, std::string> metadata;  // the header's optional __metadata__
};

// Writes the tensors (any device, any layout: each is written as its contiguous host copy) to
// `path` atomically: a temporary file beside it is renamed over it once complete, so a failed
// write leaves the previous file whole. The header is padded with spaces to a multiple of 8 bytes,
// as the reference writer does, and its tensors are in name order.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads a whole file into host tensors. A file that is not valid safetensors (a short or
// oversized header, broken JSON, an unknown or unsupported dtype, byte ranges that do not match
// their shapes, overlap, or run past the file) is refused with an Error saying what was wrong.
// Supported dtypes: BOOL, I32, I64, F32, F64 (opforge's).
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace opforge
