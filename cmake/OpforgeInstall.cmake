# `cmake --install` layout: the static library, public headers, the DSL and the kernel compiler
# sources (so user projects can generate kernels for their own ops), and a CMake package
# used as find_package(opforge) -> opforge::opforge and opforge_add_ops().
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS opforge EXPORT opforgeTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY runtime/include/opforge dsl/opforge DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES frontends/numpy/include/opforge/numpy.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/opforge)
install(DIRECTORY frontends/torch/include/opforge DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY generators/ DESTINATION ${CMAKE_INSTALL_DATADIR}/opforge/generator/generators
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.cpp")
install(DIRECTORY schedules/ DESTINATION ${CMAKE_INSTALL_DATADIR}/opforge/generator/schedules
        FILES_MATCHING PATTERN "*.hpp")
install(TARGETS opforge-cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/opforge)
install(EXPORT opforgeTargets NAMESPACE opforge:: DESTINATION ${cmake_dir})
configure_package_config_file(cmake/opforgeConfig.cmake.in ${CMAKE_BINARY_DIR}/opforgeConfig.cmake
                              INSTALL_DESTINATION ${cmake_dir}
                              PATH_VARS CMAKE_INSTALL_DATADIR CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/opforgeConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/opforgeConfig.cmake ${CMAKE_BINARY_DIR}/opforgeConfigVersion.cmake
              cmake/OpforgeKernels.cmake DESTINATION ${cmake_dir})
