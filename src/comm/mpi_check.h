#pragma once
// MPI error checks for the comm layer: communicators are set to MPI_ERRORS_RETURN, and every call
// goes through LMSCALE_MPI_CHECK, which throws lmscale::Error naming the call, the operation and
// the rank with MPI's own error text.
#include <mpi.h>

#include <string>

#include "lmscale/core/error.h"

namespace lmscale::comm::detail {

inline std::string mpi_error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<std::size_t>(len));
}

}  // namespace lmscale::comm::detail

#define LMSCALE_MPI_CHECK(expr, rank)                                                                  \
  do {                                                                                                 \
    const int _rc = (expr);                                                                            \
    if (_rc != MPI_SUCCESS) {                                                                          \
      throw ::lmscale::Error(fmt::format("{}:{}: rank {}: {} failed: {}", __FILE__, __LINE__, (rank), #expr, \
                                         ::lmscale::comm::detail::mpi_error_text(_rc)));               \
    }                                                                                                  \
  } while (0)
