# CUDA is enabled automatically when nvcc is found (LMSCALE_CUDA=AUTO), forced with ON, or
# switched off with OFF. Architectures default to 80;90a: Ampere (A100) and Hopper (H100, H200:
# wgmma, TMA). The sm90 attention kernels compile to empty bodies for 80 and are not used there (a
# run-time probe, flash_attention_sm90_fwd.cu); every other kernel is compiled for both. Override with
# -DCMAKE_CUDA_ARCHITECTURES=... (90a alone: Hopper only, the shortest CUDA compile).
set(LMSCALE_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set(LMSCALE_WITH_CUDA OFF)
if(NOT LMSCALE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(_lmscale_nvcc nvcc HINTS /usr/local/cuda/bin ENV CUDA_HOME PATH_SUFFIXES bin)
    if(_lmscale_nvcc)
      set(CMAKE_CUDA_COMPILER ${_lmscale_nvcc} CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  if(CMAKE_CUDA_COMPILER)
    set(LMSCALE_WITH_CUDA ON)
  elseif(LMSCALE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LMSCALE_CUDA=ON but nvcc was not found: install the CUDA toolkit or set CMAKE_CUDA_COMPILER")
  endif()
endif()
if(LMSCALE_WITH_CUDA AND NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "80;90a" CACHE STRING "CUDA architectures")
endif()
message(STATUS "lmscale: CUDA backend ${LMSCALE_WITH_CUDA}")
