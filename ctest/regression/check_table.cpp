// check_table FILE DATASET FIELD GOLDEN RTOL: reads column FIELD (as double) of the compound
// table DATASET in the HDF5 file FILE and compares it element by element with the numbers in
// the text file GOLDEN (one per line, '#' comments). Exit 0 when every value matches within
// RTOL (relative, with an absolute floor of RTOL), 1 otherwise, printing each mismatch.
// With GOLDEN = "-" it prints the column instead (to make a golden file).
#include <hdf5.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: check_table FILE DATASET FIELD GOLDEN|- RTOL\n");
    return 2;
  }
  const std::string file = argv[1], dset = argv[2], field = argv[3], golden = argv[4];
  const double rtol = std::stod(argv[5]);
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) { std::fprintf(stderr, "cannot open %s\n", file.c_str()); return 1; }
  hid_t d = H5Dopen2(f, dset.c_str(), H5P_DEFAULT);
  if (d < 0) { std::fprintf(stderr, "no dataset %s in %s\n", dset.c_str(), file.c_str()); return 1; }
  hid_t space = H5Dget_space(d);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space, &n, nullptr);
  // A memory type holding just the one field: HDF5 converts and picks it by name.
  hid_t mem = H5Tcreate(H5T_COMPOUND, sizeof(double));
  H5Tinsert(mem, field.c_str(), 0, H5T_NATIVE_DOUBLE);
  std::vector<double> v(n);
  if (n && H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0) {
    std::fprintf(stderr, "cannot read field %s of %s\n", field.c_str(), dset.c_str());
    return 1;
  }
  H5Tclose(mem); H5Sclose(space); H5Dclose(d); H5Fclose(f);
  if (golden == "-") {
    for (double x : v) std::printf("%.17g\n", x);
    return 0;
  }
  std::ifstream in(golden);
  std::vector<double> ref;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') ref.push_back(std::stod(line));
  int bad = 0;
  if (ref.size() != v.size()) {
    std::printf("%s/%s: %zu values, golden has %zu\n", dset.c_str(), field.c_str(), v.size(), ref.size());
    bad++;
  }
  for (std::size_t i = 0; i < std::min(ref.size(), v.size()); ++i) {
    const double tol = rtol * std::max(1.0, std::fabs(ref[i]));
    if (!(std::fabs(v[i] - ref[i]) <= tol)) {
      std::printf("row %zu: %s = %.9g, golden %.9g (tolerance %.3g)\n", i, field.c_str(), v[i], ref[i], tol);
      bad++;
    }
  }
  std::printf("%s: %zu rows of %s compared, %d mismatches\n", file.c_str(), v.size(), field.c_str(), bad);
  return bad ? 1 : 0;
}
