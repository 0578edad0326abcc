# Warnings on for our own targets (not for third-party code).
function(lmscale_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow=local -Wno-unused-parameter>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall --expt-relaxed-constexpr -lineinfo>)
endfunction()

# Sanitizers for debugging: -DLMSCALE_SANITIZE=address,undefined
set(LMSCALE_SANITIZE "" CACHE STRING "Comma-separated sanitizers for host code")
if(LMSCALE_SANITIZE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${LMSCALE_SANITIZE}> $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=${LMSCALE_SANITIZE})
endif()
