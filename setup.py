"""The wheel's two adjustments to setuptools-rust (pyproject.toml holds the rest): the library
keeps its own name, `cudapool/libcudapool.so`, rather than a Python extension's, and the wheel
is tagged for any Python 3 (the library is preloaded into processes, never imported).
"""

import os

from setuptools import setup
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


class BdistWheel(bdist_wheel):
    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(cmdclass={"build_rust": BuildRust, "bdist_wheel": BdistWheel})
