#!/usr/bin/env bash
# check_layers.sh LAYER...: the runtime's layers, lowest first (the Makefile's RT_LAYERS).
# Every `#include "DIR/..."` in runtime/L/ must name a layer no higher than L; kernels/ (the
# policy templates) may include only base/, kv/ and policy/; the compiler only base/,
# policy/ and kv/ (the ABI) and, of kernels/, k_abi.h (the settings it shares with them).
# Prints each violation as FILE:LINE: reason and exits 1 if there is one.
set -u
cd "$(dirname "$0")/.."
declare -A rank
i=0
for l in "$@"; do rank[$l]=$i; i=$((i + 1)); done
bad=0
check() { # FILE MAX_RANK ALLOWED_SET(optional, space separated)
	local f=$1 max=$2 allowed=${3:-}
	while IFS=: read -r ln inc; do
		dir=${inc%%/*}
		[ -n "${rank[$dir]+x}" ] || continue
		if [ -n "$allowed" ]; then
			case " $allowed " in *" $dir "*) continue ;; esac
			echo "$f:$ln: includes $inc (only $allowed may be included here)"; bad=1
		elif [ "${rank[$dir]}" -gt "$max" ]; then
			echo "$f:$ln: includes $inc, a layer above its own"; bad=1
		fi
	done < <(grep -n -o '#include "[a-z]*/[^"]*"' "$f" | sed 's/#include "//; s/"$//')
}
for l in "$@"; do
	for f in runtime/"$l"/*.[ch] runtime/"$l"/*.cu runtime/"$l"/*.cuh; do [ -e "$f" ] && check "$f" "${rank[$l]}"; done
done
for f in kernels/*.h kernels/*.cuh; do [ -e "$f" ] && check "$f" 0 "base kv policy"; done
for f in compiler/*.[ch]; do
	[ -e "$f" ] || continue
	check "$f" 0 "base policy kv"
	# of kernels/, only the shared settings (k_abi.h)
	while IFS=: read -r ln inc; do
		[ "$inc" = k_abi.h ] && continue
		echo "$f:$ln: includes $inc (of kernels/ the compiler may include only k_abi.h)"; bad=1
	done < <(grep -n -o '#include "k_[^"/]*"' "$f" | sed 's/#include "//; s/"$//')
done
[ "$bad" = 0 ] && echo "layers: every include points down ($*)"
exit "$bad"
