# The PASS/FAIL table of the GPU check scripts (sourced by scripts/gpu-check.sh and
# tests/gpu/gpu-sanitizer-check.sh): result() appends a row to $RESULTS, echoes it and counts
# failures in FAILS; check() turns a shell test into a row. A SKIP row is a check that could not
# run here (what it needs is not on this machine, and the row says what): counted apart, never
# as a pass.
FAILS=${FAILS:-0}
result() { # PASS|FAIL|SKIP, what, detail
  printf '%s | %s | %s\n' "$1" "$2" "$3" >> "$RESULTS"
  echo "$1 $2: $3"
  if [ "$1" = FAIL ]; then FAILS=$((FAILS + 1)); fi
}
check() { # condition (a shell test), what, detail
  if eval "$1"; then result PASS "$2" "$3"; else result FAIL "$2" "$3"; fi
}

rows() { # what, file: the "PASS | what | detail" rows a checker printed to the file join the
  # table (the file is shown first); a file with no row at all is a failure of "what ran".
  cat "$2"
  while IFS='|' read -r verdict what detail; do
    result "$(echo $verdict)" "$(echo $what)" "$(echo $detail)"
  done < <(grep -E '^(PASS|FAIL|SKIP) \|' "$2")
  grep -qE '^(PASS|FAIL|SKIP) \|' "$2" || result FAIL "$1 ran" "$(tail -3 "$2")"
}
