# Build-time kernel generation. Used by opforge's own build and, installed, by user projects:
#   opforge_add_ops(TARGET app OPS_HEADER my_ops.hpp OPS_TABLE my::ops FAMILIES elementwise)
# compiles the ops of `my::ops` (a Boost.Hana tuple of DSL op definitions) into kernels in every
# variant and links them, with their registry entries, into `app`.
include_guard(GLOBAL)
set(OPFORGE_KERNELS_CMAKE_DIR ${CMAKE_CURRENT_LIST_DIR})

# Where the DSL, generator and schedule sources live: the source tree, or the installed package.
if(NOT DEFINED OPFORGE_GENERATOR_ROOT)
  get_filename_component(OPFORGE_GENERATOR_ROOT ${CMAKE_CURRENT_LIST_DIR}/.. ABSOLUTE)
  set(OPFORGE_DSL_INCLUDE_DIRS ${OPFORGE_GENERATOR_ROOT}/dsl ${OPFORGE_GENERATOR_ROOT}/runtime/include)
endif()

# CUDA kernels are built when the CUDA toolkit is there (Halide emits the PTX itself: building needs
# neither a GPU nor the toolkit, but a machine without the toolkit has no use for them).
if(NOT DEFINED OPFORGE_CUDA_KERNELS)
  if(EXISTS /usr/local/cuda/include/cuda.h)
    set(OPFORGE_CUDA_KERNELS ON)
  else()
    set(OPFORGE_CUDA_KERNELS OFF)
  endif()
endif()

# The content-addressed kernel cache (generators/kernel_cache.hpp). Like ccache's, it lives outside
# the build folder by default, so a new build folder or a clean rebuild reuses every kernel whose
# op, schedule, target and compiler are unchanged. Empty: no cache.
if(NOT DEFINED OPFORGE_KERNEL_CACHE)
  if(DEFINED ENV{OPFORGE_KERNEL_CACHE})
    set(default_cache $ENV{OPFORGE_KERNEL_CACHE})
  elseif(DEFINED ENV{XDG_CACHE_HOME})
    set(default_cache $ENV{XDG_CACHE_HOME}/opforge/kernels)
  elseif(DEFINED ENV{HOME})
    set(default_cache $ENV{HOME}/.cache/opforge/kernels)
  else()
    set(default_cache ${CMAKE_BINARY_DIR}/kernel-cache)
  endif()
  set(OPFORGE_KERNEL_CACHE ${default_cache} CACHE PATH "Kernel cache folder (empty: none)")
endif()
set(OPFORGE_KERNEL_CACHE_MAX_MB 4096 CACHE STRING "Size above which the kernel cache drops its least recently used kernels")
# What every kernel's cache key includes besides its op's definition: the sources that schedule
# and compile kernels, and the Halide library (by size and time). Each family's pipeline builder
# and hand schedules are files of their own (generators/pipeline_<family>.hpp,
# schedules/<family>.hpp): only that family's kernels hold them in their keys, so editing one
# family's schedule regenerates that family alone. The variant list (schedules/variants.hpp) is in
# no key: the compiler writes what of it shapes a kernel into the key itself. Every other generator
# and schedule source is in every key.
set(abi_globs)
foreach(dir ${OPFORGE_DSL_INCLUDE_DIRS})
  list(APPEND abi_globs ${dir}/opforge/kernel_abi.hpp)
endforeach()
file(GLOB OPFORGE_KERNEL_SOURCES CONFIGURE_DEPENDS ${OPFORGE_GENERATOR_ROOT}/schedules/*.hpp
     ${OPFORGE_GENERATOR_ROOT}/generators/*.hpp ${OPFORGE_GENERATOR_ROOT}/generators/*.cpp
     ${abi_globs})
set(OPFORGE_FAMILIES elementwise reduction contraction window movement)
# opforge_kernel_key_files(FAMILY out_var): the sources in the keys of one family's kernels.
function(opforge_kernel_key_files family out)
  set(files)
  foreach(f ${OPFORGE_KERNEL_SOURCES})
    get_filename_component(name ${f} NAME_WE)
    get_filename_component(dir ${f} DIRECTORY)
    get_filename_component(dir ${dir} NAME)
    set(keep TRUE)
    if(dir STREQUAL "schedules" AND name STREQUAL "variants")
      set(keep FALSE)
    endif()
    foreach(other ${OPFORGE_FAMILIES})
      if(name STREQUAL "pipeline_${other}" OR (dir STREQUAL "schedules" AND name STREQUAL other))
        set(keep FALSE)
        # Movement's copies are scheduled as elementwise kernels.
        if(other STREQUAL family OR (family STREQUAL "movement" AND name STREQUAL "elementwise"))
          set(keep TRUE)
        endif()
      endif()
    endforeach()
    if(keep)
      list(APPEND files ${f})
    endif()
  endforeach()
  set(${out} ${files} PARENT_SCOPE)
endfunction()

# opforge_kernel_compiler(NAME OPS_HEADER header OPS_TABLE expr [INCLUDE_DIRS dirs...])
function(opforge_kernel_compiler name)
  cmake_parse_arguments(A "" "OPS_HEADER;OPS_TABLE" "INCLUDE_DIRS" ${ARGN})
  find_package(Halide 14 REQUIRED)
  find_package(Boost 1.74 REQUIRED)
  add_executable(${name} ${OPFORGE_GENERATOR_ROOT}/generators/kernel_compiler.cpp)
  target_include_directories(${name} PRIVATE ${OPFORGE_GENERATOR_ROOT} ${OPFORGE_DSL_INCLUDE_DIRS}
                                             ${A_INCLUDE_DIRS})
  target_compile_definitions(${name} PRIVATE OPFORGE_OPS_HEADER="${A_OPS_HEADER}"
                                             OPFORGE_OPS_TABLE=${A_OPS_TABLE})
  target_compile_features(${name} PRIVATE cxx_std_20)
  target_link_libraries(${name} PRIVATE Halide::Halide Boost::headers)
endfunction()

# opforge_kernel_outputs(DIR dir UNIT name OBJECTS out_var REGISTRY out_var): the files one unit's
# compiler run leaves in `dir`: an object per target and the registry source.
function(opforge_kernel_outputs)
  cmake_parse_arguments(A "" "DIR;UNIT;OBJECTS;REGISTRY" "" ${ARGN})
  set(objects)
  set(targets avx512 avx2 sse41 opencl)
  if(OPFORGE_CUDA_KERNELS)
    list(APPEND targets cuda)
  endif()
  foreach(t ${targets})
    list(APPEND objects ${A_DIR}/${A_UNIT}.${t}.o)
  endforeach()
  set(${A_OBJECTS} ${objects} PARENT_SCOPE)
  set(${A_REGISTRY} ${A_DIR}/${A_UNIT}.registry.cpp PARENT_SCOPE)
endfunction()

# opforge_compile_kernels(COMPILER exe FAMILY f UNIT name [SHARD i SHARDS n] [PREFIX p] [STATIC_INIT]
#                         OBJECTS out_var REGISTRY out_var)
function(opforge_compile_kernels)
  cmake_parse_arguments(A "STATIC_INIT" "COMPILER;FAMILY;UNIT;SHARD;SHARDS;PREFIX;OBJECTS;REGISTRY" "" ${ARGN})
  if(NOT A_SHARD)
    set(A_SHARD 0)
  endif()
  if(NOT A_SHARDS)
    set(A_SHARDS 1)
  endif()
  if(NOT A_PREFIX)
    set(A_PREFIX opforge_k)
  endif()
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/kernels)
  file(MAKE_DIRECTORY ${dir})
  opforge_kernel_outputs(DIR ${dir} UNIT ${A_UNIT} OBJECTS objects REGISTRY registry)
  set(flags)
  if(OPFORGE_CUDA_KERNELS)
    list(APPEND flags --cuda)
  endif()
  if(A_STATIC_INIT)
    list(APPEND flags --static-init)
  endif()
  if(OPFORGE_VARIANTS)
    list(APPEND flags --variants ${OPFORGE_VARIANTS})
  endif()
  if(OPFORGE_KERNEL_CACHE)
    list(APPEND flags --cache ${OPFORGE_KERNEL_CACHE} --cache-max-mb ${OPFORGE_KERNEL_CACHE_MAX_MB})
  endif()
  opforge_kernel_key_files(${A_FAMILY} key_files)
  foreach(f ${key_files} $<TARGET_FILE:Halide::Halide>)
    list(APPEND flags --key-file ${f})
  endforeach()
  # The autoschedulers print their search; keep it in a log and show it only on failure.
  # Adams2019 runs greedily (beam 1): a beam of 8 costs 40 s per conv kernel and target.
  set(log ${dir}/${A_UNIT}.log)
  add_custom_command(
    OUTPUT ${objects} ${registry}
    COMMAND ${CMAKE_COMMAND} -E env HL_BEAM_SIZE=1
            sh -c "\"$0\" \"$@\" > ${log} 2>&1 || { cat ${log}; exit 1; }"
            $<TARGET_FILE:${A_COMPILER}> --family ${A_FAMILY} --shard ${A_SHARD} --shards ${A_SHARDS}
            --unit ${A_UNIT} --prefix ${A_PREFIX} --out ${dir}
            --adams $<TARGET_FILE:Halide::Adams2019> --mullapudi $<TARGET_FILE:Halide::Mullapudi2016>
            --li2018 $<TARGET_FILE:Halide::Li2018> --linker ${CMAKE_LINKER} ${flags}
    DEPENDS ${A_COMPILER} ${key_files}
    COMMENT "Generating ${A_FAMILY} kernels (${A_UNIT})"
    VERBATIM)
  set(${A_OBJECTS} ${objects} PARENT_SCOPE)
  set(${A_REGISTRY} ${registry} PARENT_SCOPE)
endfunction()

# opforge_add_ops(TARGET t OPS_HEADER header OPS_TABLE expr FAMILIES f... [INCLUDE_DIRS dirs...])
function(opforge_add_ops)
  cmake_parse_arguments(A "" "TARGET;OPS_HEADER;OPS_TABLE" "FAMILIES;INCLUDE_DIRS" ${ARGN})
  if(NOT A_FAMILIES)
    set(A_FAMILIES elementwise reduction contraction window movement)
  endif()
  set(compiler ${A_TARGET}-opforge-kc)
  opforge_kernel_compiler(${compiler} OPS_HEADER ${A_OPS_HEADER} OPS_TABLE ${A_OPS_TABLE}
                          INCLUDE_DIRS ${A_INCLUDE_DIRS} ${CMAKE_CURRENT_SOURCE_DIR})
  foreach(family ${A_FAMILIES})
    opforge_compile_kernels(COMPILER ${compiler} FAMILY ${family} UNIT ${A_TARGET}_${family}
                            PREFIX opforge_u_${A_TARGET} STATIC_INIT OBJECTS objs REGISTRY reg)
    set_source_files_properties(${objs} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
    target_sources(${A_TARGET} PRIVATE ${objs} ${reg})
  endforeach()
endfunction()
