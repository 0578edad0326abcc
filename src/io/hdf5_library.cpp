#include "lmscale/io/hdf5_library.h"

#include "h5_support.h"

namespace lmscale::io {

Hdf5Library::Hdf5Library() { H5dont_atexit(); }

Hdf5Library::~Hdf5Library() {
  if (!h5::close_failed()) H5close();
}

}  // namespace lmscale::io
