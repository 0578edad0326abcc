#pragma once
// Units of the numeric attributes of results files (docs/hdf5.md "Units"). ResultsFile::set_attr
// looks every numeric attribute up here and records its unit in the object's `attribute_units`;
// table columns carry their unit in io::Column.
#include <optional>
#include <string>
#include <string_view>

namespace lmscale::io {

// The unit of a numeric attribute named `name` ("" for counts, indices, ratios and flags kept as
// 0/1 that are not "bool"), or nullopt when the name is not known: names ending in `_ms` or
// `_ms_{mean,std,min,max,median}` are ms, names ending in `_bytes` bytes, `data_*_bytes` bytes;
// every other name is listed in result_units.cpp.
std::optional<std::string> attribute_unit(std::string_view name);

}  // namespace lmscale::io
