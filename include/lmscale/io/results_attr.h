#pragma once
// Reading one attribute back from an lmscale results file (e.g. the MFU a bench-model run
// measured, /bench_model mfu), for jobs that build on an earlier run's measurements.
#include <string>

#include "lmscale/io/attr_value.h"

namespace lmscale::io {

// The attribute `name` of the group or dataset `object` ("/bench_model") in the HDF5 file `path`.
// Throws Error when the file cannot be opened or the object or attribute is missing.
AttrValue read_results_attr(const std::string& path, const std::string& object, const std::string& name);

// The MFU a bench-model results file measured (/bench_model attribute mfu); UsageError naming
// `key` when the file, the attribute or a finite value in (0, 1] is missing.
double read_bench_mfu(const std::string& key, const std::string& path);

}  // namespace lmscale::io
