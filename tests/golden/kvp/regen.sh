#!/bin/sh
# Regenerates the golden diagnostics tests/golden/kvp/bad/NAME.err (and the formatter
# golden fmt/*.fmt) with build/kvpc, from the repository root. Every .err file was read
# and judged by hand when it was first made: after running this, review `git diff` —
# a changed message is a change of the compiler's user interface.
cd "$(dirname "$0")/../../.." || exit 2
[ -x build/kvpc ] || { echo "regen.sh: build build/kvpc first (make build/kvpc)" >&2; exit 2; }
for f in tests/golden/kvp/bad/*.kvp; do
	build/kvpc check "$f" 2> "${f%.kvp}.err"
	rc=$?
	[ $rc -eq 1 ] || echo "regen.sh: $f: expected exit status 1, got $rc" >&2
done
for f in tests/golden/kvp/fmt/*.kvp; do
	build/kvpc fmt "$f" > "${f%.kvp}.fmt"
done
