#pragma once
// The HDF5 library's lifetime in the executable. By default HDF5 terminates itself at exit
// (atexit) and closes what is still open. After a close that failed (a write error while
// flushing: full disk, quota, file-size limit), HDF5 1.10 has freed the object but kept its
// identifier, and that termination crashes (SIGSEGV in H5F__close_cb). One Hdf5Library, made first
// thing in main, takes the termination over: it turns the atexit hook off and, when it is
// destroyed, terminates the library (H5close, which closes whatever is still open) unless a close
// has failed; then the library is left as it is and the operating system reclaims it.
namespace lmscale::io {

class Hdf5Library {
 public:
  Hdf5Library();    // before any other HDF5 call
  ~Hdf5Library();   // H5close(), unless a close failed
  Hdf5Library(const Hdf5Library&) = delete;
  Hdf5Library& operator=(const Hdf5Library&) = delete;
};

}  // namespace lmscale::io
