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
  // The tensors read widened from a dtype opforge does not hold, with that dtype ("BF16").
  std::map<std::string, std::string> stored_dtypes;
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
// Read as they are: BOOL, I32, I64, F32, F64 (opforge's dtypes). Read widened, every value kept
// exactly (a PyTorch file of half-precision weights loads): F16 and BF16 as float32, I8, U8, I16
// and U16 as int32, U32 as int64; stored_dtypes names what each such tensor was. Writing saves
// opforge's dtypes, so such a tensor is written back widened. Other dtypes (F8 kinds, U64,
// complex) are refused.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace opforge
