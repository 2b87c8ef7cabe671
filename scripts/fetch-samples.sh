#!/usr/bin/env bash
# Fetches NVIDIA's CUDA samples (github.com/NVIDIA/cuda-samples, BSD-3-Clause) at a pinned
# commit into .samples/src, for the GPU suite's samples gate (tests/gpu/samples.sh): the
# shared helpers (Common) and the categories that build with plain nvcc (the samples that need
# OpenGL, EGL, Vulkan, MPI or NvSci are left out when they are built). Their documentation
# folders are left out (size), and randomFog (OpenGL only). Nothing of it is committed; the device tool carries .samples.
#   bash scripts/fetch-samples.sh [REPO]   (REPO: a URL or a local clone; default GitHub)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=${1:-https://github.com/NVIDIA/cuda-samples.git}
commit=c94ff366aed18c797b8a85dfaac7817b0228b420
dirs="Common Samples/0_Introduction Samples/1_Utilities Samples/2_Concepts_and_Techniques
  Samples/3_CUDA_Features Samples/4_CUDA_Libraries Samples/6_Performance test_args.json"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if git --git-dir="$repo" rev-parse -q --verify "$commit^{commit}" >/dev/null 2>&1; then
  gitdir=$repo # a local clone that has the commit
else
  git clone -q --bare --filter=blob:none "$repo" "$tmp/repo"
  gitdir=$tmp/repo
fi
rm -rf .samples/src
mkdir -p .samples/src
# shellcheck disable=SC2086
git --git-dir="$gitdir" archive "$commit" -- $dirs ':(exclude,glob)**/doc/**' \
  ':(exclude)Samples/4_CUDA_Libraries/randomFog' | tar -x -C .samples/src
# The samples that need a display stack or a library the GPU machine lacks cannot be built
# there: they do not travel.
grep -rlE '#include\s*[<"](GL/|GLFW|EGL|vulkan|mpi\.h|nvscibuf|nvscisync|X11|FreeImage|ImageIO\.h|helper_gl\.h|cuda_gl_interop|cudaEGL|d3d)' \
  .samples/src/Samples --include='*.cu' --include='*.cpp' --include='*.h' --include='*.cuh' |
  cut -d/ -f1-5 | sort -u | xargs -r rm -rf
rm -rf .samples/src/Common/GL
echo "$commit" > .samples/src/COMMIT
echo "fetched $(find .samples/src/Samples -mindepth 2 -maxdepth 2 -type d | wc -l) samples ($(du -sh .samples/src | cut -f1)) at $commit"
