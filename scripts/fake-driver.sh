#!/usr/bin/env bash
# Builds the fake driver (tests/fake: host memory, 1 GiB per device) into DIR the way a C
# program without a GPU or a CUDA toolkit can use it: libcuda.so.1 with its SONAME, the
# libcuda.so link a linker looks for, and include/cuda.h with the driver declarations the test
# clients use. Then:
#   cc prog.c -I DIR/include $(cudapool config --cflags --libs) -L DIR -lcuda
#   LD_LIBRARY_PATH=DIR ./a.out
# usage: bash scripts/fake-driver.sh DIR      (scripts/demo.sh uses target/demo)
set -euo pipefail
dir=${1:?usage: scripts/fake-driver.sh DIR}
cd "$(dirname "$0")/.."
mkdir -p "$dir/include"
cc -shared -fPIC -Wl,-Bsymbolic -Wl,-soname,libcuda.so.1 -O1 -o "$dir/libcuda.so.1" tests/fake/libcuda.c -lpthread
ln -sf libcuda.so.1 "$dir/libcuda.so"
cp tests/c/cuda_min.h "$dir/include/cuda.h"
