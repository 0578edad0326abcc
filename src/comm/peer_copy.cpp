// The window's size (comm/peer_copy.h), shared by the CUDA exchange and the memory model.
#include "lmscale/comm/peer_copy.h"

namespace lmscale::comm {

std::size_t peer_copy_window_bytes(int size, std::size_t slot_bytes, int flags_per_sender) {
  const std::size_t slots = static_cast<std::size_t>(size - 1) * slot_bytes;
  if (flags_per_sender <= 0) return slots;
  return (slots + 7) / 8 * 8 + static_cast<std::size_t>(size) * static_cast<std::size_t>(flags_per_sender) * 8;
}

}  // namespace lmscale::comm
