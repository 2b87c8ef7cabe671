#!/usr/bin/env bash
# NVIDIA's CUDA samples as a GPU gate (issue 21): every sample that builds with plain nvcc and
# passes without cudapool must pass with it, under split, binned and simple; the samples that
# start host threads (or run host callbacks) run REPEAT times (default 20) under each kind.
#
# Needs .samples/src (scripts/fetch-samples.sh, carried to the device as `.samples`) and
# target/release/libcudapool.so. On the device:
#   bash tests/gpu/samples.sh build     builds into the samples' own folders (parallel)
#   bash tests/gpu/samples.sh run       runs them; a table in $OUT/samples.txt
#   bash tests/gpu/samples.sh           both
# Sourced by scripts/gpu-check.sh, whose PASS/FAIL table gets one row per failing sample and a
# summary row. Exits 1 when a sample that passes without cudapool fails with it.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/cudapool-samples}
LIB=${LIB:-$PWD/target/release/libcudapool.so}
S=$PWD/.samples/src
REPEAT=${REPEAT:-20}
JOBS=${JOBS:-$(nproc)}
KINDS=${KINDS:-split binned simple}
mkdir -p "$OUT/samples"
: "${RESULTS:=$OUT/results.txt}"
. tests/gpu/checks.sh

# The sample folders (one program each); ONLY=name,name keeps those.
sample_dirs() {
  find "$S/Samples" -mindepth 2 -maxdepth 2 -type d | sort |
    if [ -n "${ONLY:-}" ]; then grep -E "/($(echo "$ONLY" | tr ',' '|'))$"; else cat; fi
}

# Builds the sample in $1 as $1/<name>; prints "built NAME" or "not built NAME: reason".
build_one() {
  local d=$1 n
  n=$(basename "$d")
  local cuda_lib
  cuda_lib=$(dirname "$(command -v nvcc)")/../lib64
  local srcs=() skip=() f lit stem src libs=()
  # Kernels the program loads at run time: fatbins and PTX built beside it, sources for NVRTC.
  for lit in $(grep -ohE '"[A-Za-z0-9_]+\.(fatbin|ptx|cu)"' "$d"/*.cpp "$d"/*.cu 2>/dev/null | tr -d '"' | sort -u); do
    stem=${lit%.*}
    stem=${stem%64}
    stem=${stem%32}
    src="$d/$stem.cu"
    [ -f "$src" ] || continue
    skip+=("$src")
    case $lit in
      *.fatbin) nvcc -fatbin -arch=sm_90 -I"$S/Common" -o "$d/$lit" "$src" 2>>"$d/build.log" || { echo "not built $n: fatbin $lit"; return; } ;;
      *.ptx) nvcc -ptx -arch=sm_90 -I"$S/Common" -o "$d/$lit" "$src" 2>>"$d/build.log" || { echo "not built $n: ptx $lit"; return; } ;;
    esac
  done
  for f in "$d"/*.cu "$d"/*.cpp "$d"/*.c "$d"/src/*.cu "$d"/src/*.cpp "$d"/src/*.c; do
    [ -f "$f" ] || continue
    case " ${skip[*]:-} " in *" $f "*) continue ;; esac
    # A file another one #includes is not a unit of its own.
    grep -qE "#include\s*\"$(basename "$f")\"" "$d"/*.cu "$d"/*.cpp "$d"/*.cuh "$d"/*.h \
      "$d"/src/* "$d"/inc/* 2>/dev/null && continue
    srcs+=("$f")
  done
  [ ${#srcs[@]} -gt 0 ] || { echo "not built $n: no sources"; return; }
  # Common's helper sources, unless the sample has its own copy.
  for f in helper_multiprocess multithreading; do
    [ -f "$d/$f.cpp" ] && continue
    grep -qs "\"$f.h\"" "${srcs[@]}" "$d"/*.h && srcs+=("$S/Common/$f.cpp")
  done
  local flags=(-O2 -std=c++17 -rdc=true -arch=sm_90 -Wno-deprecated-gpu-targets -I"$S/Common"
    -I"$S/Common/UtilNPP" -I"$d" -I"$d/inc")
  grep -qs '#include <omp.h>\|#pragma omp' "${srcs[@]}" && flags+=(-Xcompiler -fopenmp -lgomp)
  for f in cuda nvrtc cublas cublasLt cufft curand cusolver cusparse nvJitLink nvjpeg \
    nppc nppial nppicc nppidei nppif nppig nppim nppist nppisu nppitc npps; do
    [ "$f" = cuda ] || [ -e "$cuda_lib/lib$f.so" ] && libs+=("-l$f")
  done
  if nvcc "${flags[@]}" -o "$d/$n" "${srcs[@]}" -Xlinker --as-needed "${libs[@]}" -lpthread \
    >>"$d/build.log" 2>&1; then
    echo "built $n"
  else
    echo "not built $n: $(grep -m1 -i 'error' "$d/build.log" | cut -c1-120)"
  fi
}

build() {
  echo "=== samples: build ($(cat "$S/COMMIT" 2>/dev/null), $JOBS at a time)"
  export -f build_one
  export S
  sample_dirs | xargs -P "$JOBS" -I{} bash -c 'build_one "$@"' _ {} > "$OUT/samples-build.txt"
  echo "$(grep -c '^built' "$OUT/samples-build.txt") built, $(grep -c '^not built' "$OUT/samples-build.txt") not built"
  grep '^not built' "$OUT/samples-build.txt" | sed 's/^/  /'
}

# The runs of sample $1: one line of arguments each ("" for none), from NVIDIA's test_args.json;
# nothing when it is to be skipped here.
runs_of() {
  python3 - "$1" "$S/test_args.json" "$(nvidia-smi -L | wc -l)" <<'PY'
import json, sys
name, path, ngpu = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = json.load(open(path)).get(name, {})
if c.get("skip") or c.get("min_gpus", 1) > ngpu:
    sys.exit(0)
for run in c.get("runs", [{"args": c.get("args", [])}]):
    print(" ".join(run.get("args", [])) or "-")
PY
}

# Runs sample $1 (its folder) without cudapool, then with it under each kind; writes one line
# to $OUT/samples/NAME.txt: NAME baseline=pass|fail|skip threaded=0|1 KIND=passed/runs ...
run_one() {
  local d=$1 n line args r k ok runs times threaded=0
  n=$(basename "$d")
  [ -x "$d/$n" ] || return 0
  local log="$OUT/samples/$n.log"
  : > "$log"
  mapfile -t argsets < <(runs_of "$n")
  if [ ${#argsets[@]} -eq 0 ]; then
    echo "$n baseline=skip" > "$OUT/samples/$n.txt"
    return 0
  fi
  grep -qsE 'pthread_create|std::thread|cutStartThread|#pragma omp|cuLaunchHostFunc|cudaLaunchHostFunc|cudaStreamAddCallback|cuStreamAddCallback' \
    "$d"/*.cu "$d"/*.cpp "$d"/*.h && threaded=1
  times=1
  [ $threaded = 1 ] && times=$REPEAT
  line="$n threaded=$threaded"
  for args in "${argsets[@]}"; do
    [ "$args" = - ] && args=""
    (cd "$d" && timeout 120 "./$n" $args) >>"$log" 2>&1
    r=$?
    if [ $r != 0 ]; then
      echo "$n baseline=fail($r) threaded=$threaded" > "$OUT/samples/$n.txt"
      return 0
    fi
  done
  line="$n baseline=pass threaded=$threaded"
  for k in $KINDS; do
    ok=0 runs=0
    for ((i = 0; i < times; i++)); do
      for args in "${argsets[@]}"; do
        [ "$args" = - ] && args=""
        runs=$((runs + 1))
        echo "--- $k run $i: $n $args" >>"$log"
        (cd "$d" && LD_PRELOAD=$LIB CUDAPOOL_POOL=$k timeout 120 "./$n" $args) >>"$log" 2>&1
        r=$?
        if [ $r = 0 ]; then ok=$((ok + 1)); else echo "--- exit $r" >>"$log"; fi
      done
    done
    line="$line $k=$ok/$runs"
  done
  echo "$line" > "$OUT/samples/$n.txt"
}

run() {
  echo "=== samples: run (without cudapool, then under $KINDS; threaded ones $REPEAT times)"
  rm -f "$OUT"/samples/*.txt
  export -f run_one runs_of
  export S OUT LIB REPEAT KINDS
  # A few at a time: the GPU has room for all of them; the threaded ones take the longest.
  sample_dirs | xargs -P 4 -I{} bash -c 'run_one "$@"' _ {}
  cat "$OUT"/samples/*.txt | sort > "$OUT/samples.txt"
  local base pass=0 bad=0 skipped=0 failing_alone=0 threaded=0 l name
  while read -r l; do
    name=${l%% *}
    case $l in
      *baseline=skip*) skipped=$((skipped + 1)) ;;
      *baseline=fail*) failing_alone=$((failing_alone + 1)) ;;
      *)
        [[ $l == *threaded=1* ]] && threaded=$((threaded + 1))
        # Every KIND=ok/runs must read ok == runs.
        if echo "$l" | tr ' ' '\n' | grep -E '^(split|binned|simple)=' | awk -F'[=/]' '$2 != $3 { bad = 1 } END { exit bad }'; then
          pass=$((pass + 1))
        else
          bad=$((bad + 1))
          result FAIL "sample $name" "$l (log: samples/$name.log)"
        fi
        ;;
    esac
  done < "$OUT/samples.txt"
  base=$((pass + bad))
  kinds=$(echo $KINDS | sed 's/ \([^ ]*\)$/ and \1/; s/ \([^ ]*\) and/, \1 and/')
  check "[ $bad = 0 ] && [ $base -gt 0 ]" "NVIDIA CUDA samples under $kinds" \
    "$pass of $base samples that pass without cudapool pass with it under $kinds ($threaded threaded ones $REPEAT times each); $failing_alone fail without cudapool, $skipped skipped (NVIDIA's list, GPU count)"
  cat "$OUT/samples.txt"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  [ -d "$S/Samples" ] || { echo "no samples in $S: run scripts/fetch-samples.sh here first, and carry .samples"; exit 1; }
  case ${1:-all} in
    build) build ;;
    run) run ;;
    all) build && run ;;
    *) echo "usage: $0 [build|run|all]"; exit 2 ;;
  esac
  [ "$FAILS" = 0 ]
fi
