# The PASS/FAIL table of the GPU check scripts (sourced by scripts/gpu-check.sh and
# tests/gpu/gpu-sanitizer-check.sh): result() appends a row to $RESULTS, echoes it and counts
# failures in FAILS; check() turns a shell test into a row.
FAILS=${FAILS:-0}
result() { # PASS|FAIL, what, detail
  printf '%s | %s | %s\n' "$1" "$2" "$3" >> "$RESULTS"
  echo "$1 $2: $3"
  if [ "$1" = FAIL ]; then FAILS=$((FAILS + 1)); fi
}
check() { # condition (a shell test), what, detail
  if eval "$1"; then result PASS "$2" "$3"; else result FAIL "$2" "$3"; fi
}
