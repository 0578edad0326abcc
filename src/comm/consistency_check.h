#pragma once
// Check mode: before a collective, every rank all-gathers a descriptor of the call it is making
// (kind, dtype, reduce op, counts, root, algorithm) and compares; on any difference all ranks
// throw MismatchError with the same message, instead of hanging or writing past a buffer.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "lmscale/comm/communicator.h"
#include "lmscale/core/error.h"

namespace lmscale::comm::detail {

// Thrown on every rank alike, so the communicator stays usable.
class MismatchError : public Error {
 public:
  using Error::Error;
};

using Descriptor = std::array<std::int64_t, 8>;

// `resolved_algo`: the algorithm the call will really use.
Descriptor describe_call(const Request& req, Algo resolved_algo, int size);

// all_to_all_v: sent_to_me[r] = the elements rank r's call sends to this rank; returns a text
// naming every block whose size differs from this rank's recv_counts (empty when all match).
std::string all_to_all_count_errors(const Request& req, const std::vector<std::int64_t>& sent_to_me, int rank);

// all[r] = rank r's descriptor. Throws MismatchError when they differ.
void verify_descriptors(const std::vector<Descriptor>& all);

}  // namespace lmscale::comm::detail
