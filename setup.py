"""The wheel's adjustments to setuptools-rust (pyproject.toml holds the rest): the library
keeps its own name, `cudapool/libcudapool.so`, rather than a Python extension's; the wheel is
tagged for any Python 3 (the library is preloaded into processes, never imported); and the
package carries what C and C++ builds need beside the library (`cudapool config` finds them):
`include/cudapool.h`, `pkgconfig/cudapool.pc` and `cmake/cudapool-config.cmake`, each written
relative to where it lies, so they hold wherever pip puts the package.
"""

import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools_rust.build import build_rust

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel


class BuildRust(build_rust):
    def get_dylib_ext_path(self, ext, target_fname):
        path = super().get_dylib_ext_path(ext, target_fname)
        if target_fname == "cudapool.libcudapool":
            return os.path.join(os.path.dirname(path), "libcudapool.so")
        return path


HERE = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(HERE, "Cargo.toml")) as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)


PC = """# cudapool's C API, from the pip package this file lies in.
prefix=${{pcfiledir}}/..
includedir=${{prefix}}/include
libdir=${{prefix}}

Name: cudapool
Description: The C API of cudapool, a caching pool and hard memory limit for CUDA programs
Version: {version}
Cflags: -I${{includedir}}
Libs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lcudapool
"""

CMAKE = """# cudapool's CMake package, from the pip package this file lies in: find_package(cudapool)
# gives the imported target cudapool::cudapool (the header's folder and the library).
get_filename_component(_cudapool_pkg "${{CMAKE_CURRENT_LIST_DIR}}/.." ABSOLUTE)
if(NOT TARGET cudapool::cudapool)
  add_library(cudapool::cudapool SHARED IMPORTED)
  set_target_properties(cudapool::cudapool PROPERTIES
    IMPORTED_LOCATION "${{_cudapool_pkg}}/libcudapool.so"
    IMPORTED_NO_SONAME TRUE
    INTERFACE_INCLUDE_DIRECTORIES "${{_cudapool_pkg}}/include")
endif()
set(cudapool_VERSION {version})
"""

CMAKE_VERSION = """set(PACKAGE_VERSION {version})
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
"""


class BuildPy(build_py):
    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "cudapool")
        v = version()
        os.makedirs(os.path.join(pkg, "include"), exist_ok=True)
        shutil.copy(os.path.join(HERE, "include", "cudapool.h"), os.path.join(pkg, "include"))
        for rel, text in [
            ("pkgconfig/cudapool.pc", PC),
            ("cmake/cudapool-config.cmake", CMAKE),
            ("cmake/cudapool-config-version.cmake", CMAKE_VERSION),
        ]:
            path = os.path.join(pkg, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text.format(version=v))


class BdistWheel(bdist_wheel):
    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(cmdclass={"build_rust": BuildRust, "build_py": BuildPy, "bdist_wheel": BdistWheel})
