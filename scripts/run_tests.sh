#!/usr/bin/env bash
# Run each `check` suite binary given, print its summary, and finish with one line
# "N passed, N failed" over all suites (counted in tests, from check's own summaries).
# Usage: scripts/run_tests.sh BUILD_DIR BIN...
set -uo pipefail
bdir=$1; shift
pass=0; fail=0; bad_suites=()
mkdir -p "$bdir/test-logs"
for t in "$@"; do
  name=$(basename "$t")
  log="$bdir/test-logs/$name.log"
  ( cd "$(dirname "$0")/.." && "$t" ) >"$log" 2>&1
  rc=$?
  summ=$(grep -E '^[0-9]+%: Checks: ' "$log" | tail -n 1)
  if [ -z "$summ" ]; then
    echo "$name: no check summary (exit $rc); log follows"; tail -n 40 "$log"
    fail=$((fail + 1)); bad_suites+=("$name"); continue
  fi
  echo "$name: $summ"
  n=$(sed -E 's/.*Checks: ([0-9]+).*/\1/' <<<"$summ")
  f=$(sed -E 's/.*Failures: ([0-9]+).*/\1/' <<<"$summ")
  e=$(sed -E 's/.*Errors: ([0-9]+).*/\1/' <<<"$summ")
  pass=$((pass + n - f - e)); fail=$((fail + f + e))
  if [ "$rc" != 0 ] || [ "$f" != 0 ] || [ "$e" != 0 ]; then
    grep -E ':[EF]:' "$log" | head -n 20
    bad_suites+=("$name")
    [ "$f" = 0 ] && [ "$e" = 0 ] && { fail=$((fail + 1)); echo "$name: exit $rc"; tail -n 20 "$log"; }
  fi
done
echo "tests: $pass passed, $fail failed"
[ "${#bad_suites[@]}" = 0 ] || { echo "failing suites: ${bad_suites[*]}"; exit 1; }
