#!/usr/bin/env bash
# `make results`: every policy in policies/ on the real model
# (SmolLM2-135M-Instruct, Q4_1) and two offline texts, at several compression ratios, with
# the full cache as the reference, and passkey accuracy at several prompt lengths and
# depths, and the byte frontier (mean KL and retrieval accuracy against the compression in
# bytes); writes docs/results.md (tables, commit, model hash, parameters, command, wall
# time) and docs/results/*.svg (kld_mean against the ratio, one line per policy; kld_mean
# against bytes, one line per policy and store type) — a narrowed run writes them under
# OUT/docs instead (see "Where the document goes" below).
#
# Steps:
#  1. build one per-deployment binary holding the policies measured (kvpc build is cached);
#  2. cut the first RESULTS_TOKENS tokens' worth of bytes of each text (the Info manuals of
#     coreutils and gettext, decompressed with zcat; the GPL-3 text where one is missing);
#     iconv -c drops a multi-byte character that the byte cut may have split;
#  3. for each text, policy and ratio: `BIN ppl --ctx N --ratio R --json` (streaming
#     perplexity with the full-cache reference in the same run, so every JSON line carries
#     both ppl and ppl_ref, and the KL statistics against it); --ratio R makes the budget
#     N / R entries per (layer, KV head) in place of the policy's own budget (a fixed entry
#     count such as snapkv's 1024 included). A policy whose guards exceed N / R is refused
#     by the binary and reported as "n/a (guards exceed budget)". StreamingLLM and the
#     sliding window have no budget but their guards, so their window is set to the
#     ratio's budget (recent = N/R - sinks; window = N/R), as `make demo` does;
#  4. the byte frontier (scripts/results/frontier.py): mean KL (`ppl --batch`, against the
#     full cache of the same path) of FRONTIER_POLICIES against the compression in bytes
#     over an f16 full cache, 2x to 32x: each eviction-only policy at each ratio in each KV
#     store type (a batch line's `--kv-type T`: f32 rows are 4 bytes, f16 2, q8_0 34/32 per
#     element, so ratio R gives R/2, R and about 1.9R in bytes; a cell outside
#     FRONTIER_MIN_X..FRONTIER_MAX_X in bytes is not run; on the fast path an f16 cell is the
#     sweep's cell of step 3, copied, not run twice), and each policy that chooses its own
#     precision (`precision = tiers(...)`, FRONTIER_OWN_KV_POLICIES) in the default store: at
#     each byte ratio in bounds (`--byte-ratio R`) when its budget is `bytes(P)`, else once
#     at its own budget (quantisation only); streaming and prompt-end as in step 3 (a
#     prompt-end cell's bytes are its prompt's, right after the compress: ppl's
#     prompt_bytes_compression);
#  5. `BIN needle --task passkey --lengths LENGTHS --depths DEPTHS --ratio R` per policy
#     in NEEDLE_POLICIES at each ratio in NEEDLE_RATIOS, plus the full cache;
#  6. the frontier's retrieval accuracy (`needle --batch --task T` for each of
#     FRONTIER_NEEDLE_TASKS: passkey, multi-key, multi-instruction) of its cells (passkey
#     cells in f16 are step 5's where it ran them, on the fast path);
#  7. render docs/results.md and the SVG plots from the collected JSON (python3, stdlib).
# Each measurement is cached as one JSON file under OUT (keyed by text, tokens, policy,
# ratio, and the policy's source hash), written when its pass ends, so an interrupted run
# resumes where it stopped, losing at most the passes that were running; RESULTS_FRESH=1
# discards them; `touch OUT/stop` ends a run after its running passes (the document is
# rendered from the cache). Perplexity comes before retrieval: steps 3 and 4 text by text
# (the first text's sweep and frontier, then the next text's), then 5 and 6, so a run cut
# short holds whole texts' perplexity before any retrieval. Passes run RESULTS_JOBS at once, each of at most
# RESULTS_PASS_CELLS cells, every pass with the same forward chunk (512 / (RESULTS_PASS_CELLS
# + 1) tokens), so a cell does not depend on the pass it was in (tests/test_seq.c: a run of a
# lockstep pass computes what a separate run with that chunk computes); RESULTS_JOBS does not
# change a result, RESULTS_PASS_CELLS does through the chunk (at the fast path's rounding)
# and is kept at its default by a full run that resumes.
#
# Progress: a line "results: pass K: WHAT (time)" as each pass starts, then the pass's
# binary reports on stderr (a bar with tok/s and ETA on a terminal, a plain line per tenth
# of the pass otherwise, so logs and CI show the run moving); --quiet (or RESULTS_QUIET=1)
# silences both (the per-cell result lines stay).
#
# Usage: scripts/results/results.sh [--quiet] [BUILD_DIR [MODEL]]
# Environment (defaults in brackets):
#   RESULTS_TOKENS [4096]        tokens scored per text
#   RATIOS ["2 4 8 16 32 64 128"] compression ratios (64 and 128 are refused where guards
#                                exceed N / R; those cells read n/a)
#   POLICIES [every policies/*.kvp except full, in file order]
#   TEXTS ["coreutils gettext"]  names of /usr/share/info/NAME.info.gz (GPL-3 if missing)
#   LENGTHS [1024,2048,4096]     passkey prompt lengths (tokens)
#   DEPTHS [0,25,50,75,100]      passkey depths (percent)
#   NEEDLE_POLICIES [$POLICIES]  policies run through the passkey test
#   NEEDLE_RATIOS [8 16 32]      ratios of the passkey test
#   THREADS [1; nproc when RESULTS_JOBS=1]  BLAS threads per pass
#   RESULTS_JOBS [nproc]         passes at once (independent processes keep every core busy)
#   RESULTS_PASS_CELLS [9]       cells per lockstep pass (each pass recomputes the full-cache
#                                reference, about one cell's cost; a smaller pass loses less
#                                when the run is interrupted), and the chunk 512 / (cells + 1)
#   RESULTS_DOC [docs/results.md] RESULTS_NOTE: a paragraph put at the top of the document
#   OUT [BUILD_DIR/results]      where the binary, texts and JSON go
#   RESULTS_RENDER_ONLY=1        measure nothing: render what the cache holds (cells not
#                                measured read "not run")
#   FRONTIER [1]                 0: no byte frontier
#   FRONTIER_POLICIES [caote_tova tova snapkv h2o expected_attention expected_attention_prompt kvzip,
#                                then every policy with a `precision` statement]
#   FRONTIER_OWN_KV_POLICIES [those with a `precision` statement] policies run in the default
#                                store (their own precision) instead of per KV type
#   FRONTIER_KV_TYPES ["f16 q8_0"]  store types of the eviction-only cells (f32 rows,
#                                at twice f16's bytes, are RESULTS_FAST=0's reference)
#   FRONTIER_RATIOS ["1 2 4 8 16 32 64"] FRONTIER_MIN_X [2] FRONTIER_MAX_X [32]
#   FRONTIER_PROTOCOLS ["stream prompt_end"]
#   FRONTIER_NEEDLE [1]          0: no passkey cells in the frontier
#   FRONTIER_NEEDLE_POLICIES [$FRONTIER_POLICIES] the frontier policies whose cells also get
#                                retrieval runs (the full cache is measured beside them)
#   FRONTIER_NEEDLE_TASKS ["passkey multikey instruct"] the retrieval columns, `needle --task`
#                                names: passkey; multikey (four keys in the context, one
#                                asked, the others distractors); instruct (three instructions
#                                in the system prompt, scored against what the full cache's
#                                answers follow); one needle pass per task and protocol
#   RESULTS_FAST [1]             1: every pass on the fast path (`--fast`: the full-cache
#                                reference and the top tier are f16 rows, the store a
#                                deployment runs and the byte frontier's reference; a batch
#                                line's own --kv-type still chooses its store, and a line
#                                without one gets its policy's default, f32 rows for GraceKV
#                                as for a single run); 0: the exact path (f32 rows, f32
#                                reference); the document's header says which
#   RESULTS_QUICK=1              a narrowed run in minutes: 2048 tokens of coreutils, no
#                                per-policy sweep and no passkey, the streaming frontier of
#                                three block-wise policies (caote_tova, expected_attention,
#                                h2o_block: chunks of 128 tokens, where a per-step policy
#                                such as tova feeds every run token by token) at ratios
#                                2 4 8 16 in f16 and q8_0 stores (each knob above overrides)
# Where the document goes: only the full run (none of the knobs above set) writes
# docs/results.md and docs/results/*.svg in the tree; a narrowed run writes OUT/docs/results.md
# and OUT/docs/results/*.svg (RESULTS_DOC may name another place outside the tree, or under
# the ignored build folder; one inside the tree is refused before anything runs). The rule
# is scripts/results/cells.py doc_refusal, applied here and again by render.py and
# frontier.py before they write; tests/results/test_doc_rule.py checks it (`make test`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)  # render.py, frontier.py, cells.py, svg.py
quiet=${RESULTS_QUIET:-0}
narrowed=0
for v in RESULTS_TOKENS RATIOS POLICIES TEXTS LENGTHS DEPTHS NEEDLE_POLICIES NEEDLE_RATIOS \
	FRONTIER FRONTIER_POLICIES FRONTIER_OWN_KV_POLICIES FRONTIER_KV_TYPES FRONTIER_RATIOS \
	FRONTIER_MIN_X FRONTIER_MAX_X FRONTIER_PROTOCOLS FRONTIER_NEEDLE FRONTIER_NEEDLE_POLICIES \
	FRONTIER_NEEDLE_TASKS RESULTS_QUICK; do
	[ -z "${!v+x}" ] || narrowed=1
done
[ "${RESULTS_FAST-1}" = 1 ] || narrowed=1 # the exact path: another reference
if [ "${RESULTS_QUICK:-0}" = 1 ]; then
	: "${RESULTS_TOKENS:=2048}" "${TEXTS=coreutils}" "${POLICIES=}" "${NEEDLE_RATIOS=}"
	: "${FRONTIER_POLICIES:=caote_tova expected_attention h2o_block}" "${FRONTIER_KV_TYPES:=f16 q8_0}"
	: "${FRONTIER_RATIOS:=2 4 8 16}" "${FRONTIER_PROTOCOLS:=stream}" "${FRONTIER_NEEDLE:=0}"
	POLICIES_SET=1
fi
if [ "${1:-}" = --quiet ]; then quiet=1; shift; fi
bdir=${1:-build}
model=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
tokens=${RESULTS_TOKENS:-4096}
ratios=${RATIOS:-2 4 8 16 32 64 128}
texts=${TEXTS-coreutils gettext}
lengths=${LENGTHS:-1024,2048,4096}
depths=${DEPTHS:-0,25,50,75,100}
# passes at once (RESULTS_JOBS) and BLAS threads per pass: one thread per pass and one pass per
# core: independent passes keep every core busy with no thread synchronisation between them
jobs=${RESULTS_JOBS:-$(nproc)}
[ "$jobs" -ge 1 ] 2>/dev/null || { echo "results.sh: RESULTS_JOBS=$jobs: not a count of passes" >&2; exit 2; }
if [ "$jobs" -gt 1 ]; then threads=${THREADS:-1}; else threads=${THREADS:-$(nproc)}; fi
# cells per pass: a pass's cells are cached when it ends, so an interrupted run loses at most
# one pass per job; each pass recomputes the full-cache reference (about one cell's cost).
# Every pass runs with one forward chunk, 512 / (pass_cells + 1) tokens per sequence (what a
# lockstep pass of pass_cells runs and the reference gets by default): the chunk moves the
# fast path's rounding, and through it a score-driven eviction's choices (tova's mean KL by
# about 2 % between chunks of 46 and 51 tokens on 384 tokens of coreutils), so a cell must not depend on how many
# other cells shared its pass
pass_cells=${RESULTS_PASS_CELLS:-9}
[ "$pass_cells" -ge 1 ] 2>/dev/null || { echo "results.sh: RESULTS_PASS_CELLS=$pass_cells: not a count of cells" >&2; exit 2; }
chunk=$((512 / (pass_cells + 1)))
[ "$chunk" -ge 16 ] || { echo "results.sh: RESULTS_PASS_CELLS=$pass_cells: passes above 31 cells would chunk below 16 tokens (the fast path's f32-activation case)" >&2; exit 2; }
# the store of every pass: the fast path, f16 rows (the store a deployment runs, and the
# reference the byte frontier counts against, so the whole document has one reference; a
# policy that rewrites f32 rows, GraceKV, gets them from the runtime's rule for its line);
# RESULTS_FAST=0 measures on the exact path (f32 rows and reference)
RESULTS_FAST=${RESULTS_FAST-1}
fast=()
[ "$RESULTS_FAST" = 1 ] && fast=(--fast)
out=${OUT:-$bdir/results}
if [ "$narrowed" = 1 ]; then doc=${RESULTS_DOC:-$out/docs/results.md}; else doc=${RESULTS_DOC:-docs/results.md}; fi
svgdir="$(dirname "$doc")/results"
# a narrowed run may write its document only outside the tree or under an ignored path (the
# build folder): never beside the tracked docs (the rule: scripts/results/cells.py doc_refusal)
RESULTS_NARROWED=$narrowed python3 "$here/cells.py" --check-doc "$doc" || exit 2
if [ -z "${POLICIES+x}" ] && [ -z "${POLICIES_SET:-}" ]; then
	POLICIES=$(for f in policies/*.kvp; do b=$(basename "$f" .kvp); [ "$b" = full ] || printf '%s ' "$b"; done)
fi
policies=$POLICIES
needle_policies=${NEEDLE_POLICIES-$policies}
needle_ratios=${NEEDLE_RATIOS-8 16 32}
cmdline="$0 $*"
envline="RESULTS_FAST=$RESULTS_FAST RESULTS_TOKENS=$tokens RATIOS=\"$ratios\" TEXTS=\"$texts\" LENGTHS=$lengths DEPTHS=$depths THREADS=$threads POLICIES=\"$policies\" NEEDLE_POLICIES=\"$needle_policies\" NEEDLE_RATIOS=\"$needle_ratios\""

[ -r "$model" ] || { echo "results.sh: $model: model not found (scripts/fetch_model.sh)" >&2; exit 1; }
[ "${RESULTS_FRESH:-0}" = 1 ] && rm -rf "$out/ppl" "$out/needle" "$out/frontier"
frontier=${FRONTIER:-1}
# has_precision NAME: the policy chooses its entries' precision (`precision = tiers(...)`)
has_precision() { grep -q '^[[:space:]]*precision[[:space:]]*=' "policies/$1.kvp"; }
# byte_budget NAME: its budget is a share of an f16 full cache's bytes (`budget = bytes(P)`)
byte_budget() { grep -q '^[[:space:]]*budget[[:space:]]*=[[:space:]]*bytes(' "policies/$1.kvp"; }
if [ -z "${FRONTIER_POLICIES+x}" ]; then
	FRONTIER_POLICIES="caote_tova tova snapkv h2o expected_attention expected_attention_prompt kvzip"
	for f in policies/*.kvp; do
		if has_precision "$(basename "$f" .kvp)"; then FRONTIER_POLICIES="$FRONTIER_POLICIES $(basename "$f" .kvp)"; fi
	done
fi
[ "$frontier" = 1 ] || FRONTIER_POLICIES=""
fpolicies=$FRONTIER_POLICIES
if [ -z "${FRONTIER_OWN_KV_POLICIES+x}" ]; then
	FRONTIER_OWN_KV_POLICIES=$(for p in $fpolicies; do if has_precision "$p"; then printf '%s ' "$p"; fi; done)
fi
fown=$FRONTIER_OWN_KV_POLICIES
fkv=${FRONTIER_KV_TYPES:-f16 q8_0}
fratios=${FRONTIER_RATIOS:-1 2 4 8 16 32 64}
fmin=${FRONTIER_MIN_X:-2}
fmax=${FRONTIER_MAX_X:-32}
fprot=${FRONTIER_PROTOCOLS:-stream prompt_end}
fneedle=${FRONTIER_NEEDLE:-1}
fnpolicies=${FRONTIER_NEEDLE_POLICIES-$fpolicies}
fntasks=${FRONTIER_NEEDLE_TASKS:-passkey multikey instruct}
envline="$envline FRONTIER_POLICIES=\"$fpolicies\" FRONTIER_KV_TYPES=\"$fkv\" FRONTIER_RATIOS=\"$fratios\" FRONTIER_PROTOCOLS=\"$fprot\" FRONTIER_NEEDLE=$fneedle FRONTIER_NEEDLE_POLICIES=\"$fnpolicies\" FRONTIER_NEEDLE_TASKS=\"$fntasks\""
mkdir -p "$out/ppl" "$out/needle" "$(dirname "$doc")" "$svgdir"
# A stop left by an earlier run is cleared by an invocation that measures (one touched from
# now on counts); a render-only invocation leaves it, so rendering beside a resumed run that
# was told to stop does not let that run start new passes.
[ "${RESULTS_RENDER_ONLY:-0}" = 1 ] || rm -f "$out/stop"
start=$(date +%s)

# 1. one binary with the policies measured (the full cache is built in, for the needle
# baseline); a narrowed sweep builds only what it runs
bin="$out/bin"
srcs=$(for p in $policies $needle_policies $fpolicies; do echo "policies/$p.kvp"; done | awk '!seen[$0]++')
# shellcheck disable=SC2086 # one word per source
"$bdir/kvpc" build $srcs -o "$bin"

# 2. texts
textfiles=()
for t in $texts; do
	f="$out/$t.$tokens.txt"
	if [ -r "/usr/share/info/$t.info.gz" ]; then
		{ zcat "/usr/share/info/$t.info.gz" || true; } | head -c $((tokens * 16)) |
			iconv -c -f UTF-8 -t UTF-8 >"$f"
	else
		echo "results.sh: /usr/share/info/$t.info.gz missing; using GPL-3 for $t" >&2
		iconv -c -f UTF-8 -t UTF-8 /usr/share/common-licenses/GPL-3 >"$f"
	fi
	textfiles+=("$f")
done

# 3. perplexity and KL against the full cache
# extra_sets POLICY RATIO: --set arguments that size a guard-only policy to the ratio
# (CAOTE over H2O's recent guard of 1024 tokens is split with the heavy hitters half and
# half, as H2O's own 10% + 10%, and H2O itself gets the same halves: its recent share of 10%
# would otherwise stay 10% of the context and take most of a small budget); a prompt-end policy (SnapKV, PyramidKV, Ada-KV, GraceKV,
# CAOTE over SnapKV) compresses once when the prompt ends, which in a ppl run without
# --prompt is after the last token, so it is run with the first half of the text as its
# prompt (--prompt N/2, budget N/2 / R entries per head) and scored on the second half.
extra_sets() {
	local b=$(($3 / $2))
	case $1 in
	streaming_llm) echo "--set recent=$((b - 4))" ;;
	sliding_window) echo "--set window=$b" ;;
	caote_h2o | caote_fast_h2o | h2o_block) echo "--set heavy=$((b - b / 2)) --set recent=$((b / 2))" ;;
	h2o) # heavy and recent halves of the budget, as the H2O paper (shares of the context)
		local h
		h=$(awk -v r="$2" 'BEGIN { printf "%g", 50 / r }')
		echo "--set heavy=$h% --set recent=$h%" ;;
	esac
}
# the policy's measurement protocol as the compiler recorded it from its trigger (BIN info's
# "measure", docs/measuring.md); info.json is written before the first pass
prompt_end() { jq -e --arg p "$1" 'any(.policies[]; .name == $p and .measure == "prompt_end")' \
	"$out/info.json" >/dev/null; }
# split_pass WHAT RUNS RC JQ CELL...: the JSON lines of a --batch pass (RUNS.jsonl, in the
# order of the runs file) into one cache file per cell; a line with an "error" (the run left
# the pass: guards above its budget) is cached with rc 1. JQ formats a success for the log.
split_pass() {
	local what=$1 runs=$2 rc=$3 fmt=$4 i=0 line
	shift 4
	local cells=("$@")
	while IFS= read -r line; do
		[ $i -lt ${#cells[@]} ] || break
		local tag
		tag=$(echo "$line" | jq -r '"\(.policy) r\(.ratio)"')
		if echo "$line" | jq -e 'has("error")' >/dev/null; then
			echo "$line" | jq -c '. + {rc: 1}' >"${cells[$i]}"
			echo "$what $tag: refused: $(echo "$line" | jq -r .error)"
		else
			echo "$line" >"${cells[$i]}"
			echo "$what $tag: $(echo "$line" | jq -r "$fmt")"
		fi
		i=$((i + 1))
	done <"$runs.jsonl"
	if [ $i -lt ${#cells[@]} ]; then
		echo "results.sh: $what stopped (status $rc) after $i of ${#cells[@]} runs:" >&2
		tail -n 3 "$runs.err" >&2
	fi
}

# run_pass OUT ERR CMD...: one pass of a binary, its JSON lines into OUT. Its progress
# reaches our stderr unless quiet: straight through on a terminal (the bar), else as plain
# lines, copied to ERR as well with the binary's messages. Returns the binary's status.
npass=0
run_pass() {
	local out=$1 err=$2
	shift 2
	if [ "$quiet" = 1 ]; then
		"$@" --quiet >"$out" 2>"$err"
	elif [ -t 2 ]; then
		: >"$err"
		"$@" >"$out"
	else
		"$@" 2>&1 >"$out" | tee "$err" >&2
		return "${PIPESTATUS[0]}"
	fi
}
# say_pass WHAT: "results: pass K: WHAT (HH:MM:SS)" unless quiet
say_pass() {
	npass=$((npass + 1))
	[ "$quiet" = 1 ] || echo "results: pass $npass: $1 ($(date -u +%H:%M:%S))" >&2
}

# The pass queue. queue_cell LINE CELL adds one run (a --batch line) and the cache file its
# JSON line goes to; queue_flush WHAT BASE FMT CMD... splits what was queued into passes of at
# most $pass_cells runs (near-equal sizes), each `CMD --batch BASE.K.runs` started in the
# background once fewer than $jobs passes run; phase_end waits for every pass (a later phase
# reads what an earlier one cached). Every pass has the same chunk ($chunk), so splitting
# changes no result (tests/test_seq.c).
qlines=() qcells=()
queue_cell() { qlines+=("$1"); qcells+=("$2"); }
# expect CELL POLICY: the run asks for this cell (measured now or cached): OUT/expected.cells
# lists each with the policy's source hash ("-" for the full cache), render.py's count of
# what the document holds
expect() { echo "$1 $([ "$2" = full ] && echo - || policy_hash "$2")" >>"$out/expected.cells"; }
pass_job() { # pass_job WHAT RUNS FMT CMD...: one pass, then its cells' cache files
	local what=$1 runs=$2 fmt=$3 rc cells
	shift 3
	set +e
	run_pass "$runs.jsonl" "$runs.err" "$@" --batch "$runs"
	rc=$?
	set -e
	mapfile -t cells <"$runs.cells"
	split_pass "$what" "$runs" "$rc" "$fmt" "${cells[@]}"
}
queue_flush() {
	local what=$1 base=$2 fmt=$3 n=${#qlines[@]} k i=0 m np part
	shift 3
	[ "$n" -gt 0 ] && [ "$render_only" != 1 ] || { qlines=() qcells=(); return 0; }
	np=$(((n + pass_cells - 1) / pass_cells))
	for ((k = 0; k < np; k++)); do
		while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || failed=1; done
		if [ -e "$out/stop" ]; then
			[ "$stopping" = 1 ] || echo "results: $out/stop exists: no new pass; the running ones end, then the cached cells are rendered (a later run resumes)" >&2
			stopping=1
			break
		fi
		m=$(((n - i) / (np - k)))
		printf '%s\n' "${qlines[@]:i:m}" >"$base.$k.runs"
		printf '%s\n' "${qcells[@]:i:m}" >"$base.$k.runs.cells"
		i=$((i + m))
		part=""
		[ "$np" -gt 1 ] && part=" (part $((k + 1)) of $np)"
		say_pass "$what, $m runs$part"
		pass_job "$what" "$base.$k.runs" "$fmt" "$@" &
	done
	qlines=() qcells=()
}
# phase_end: wait for every pass; a pass that failed (its cells not cached: a jq or write
# error, not a refusal, which is a cell) makes the run end with status 1 after rendering
phase_end() {
	local rc
	while :; do
		rc=0
		wait -n || rc=$?
		[ "$rc" != 127 ] || break # no job left
		[ "$rc" = 0 ] || failed=1
	done
}
failed=0
# an interrupted or failed script takes its passes with it (a background job ignores SIGINT,
# so Ctrl-C alone would leave them writing cells)
stop_passes() {
	local p
	for p in $(jobs -p); do
		pkill -TERM -P "$p" 2>/dev/null || true
		kill -TERM "$p" 2>/dev/null || true
	done
}
trap stop_passes EXIT
trap 'exit 130' INT TERM
# `touch OUT/stop` ends a run early: the running passes end and cache their cells, no new one
# starts, and the document is rendered from what the cache holds (cells not measured read
# "not run"); the next run removes the file and resumes
stopping=0
# cached CELL POLICY: the cell holds a measurement of this source of the policy (a cell of
# another hash is stale and measured again)
# (and of this run's path: a cell of the exact path, activations f32, is not the fast path's)
act=f32
[ "$RESULTS_FAST" = 1 ] && act=q8
cached() {
	[ -s "$1" ] && [ "$(jq -r '"\(.policy_hash // "") \(.activations // "")"' "$1")" = "$(policy_hash "$2") $act" ]
}
# A frontier cell in the f16 store on the fast path runs the very batch line of the sweep's
# cell of that (policy, ratio) (the store of every pass is f16): defer_sweep lists it instead
# of queueing it, and copy_deferred, once the phase's passes have ended, copies the sweep's
# cell when it is cached and was measured in that store (its kv_type; a policy that needs f32
# rows, GraceKV, has its own); a cell the sweep did not measure stays "not run".
deferred=()
defer_sweep() { # defer_sweep CELL SWEEP_CELL POLICY KV RATIO SWEEP_POLICIES SWEEP_RATIOS
	[ "$4" = f16 ] && [ "$RESULTS_FAST" = 1 ] && in_list "$3" $6 && in_list "$5" $7 || return 1
	deferred+=("$1" "$2" "$3") # three entries per cell
}
copy_deferred() { # a copy that fails marks the run failed (rendered, then exit 1)
	local i
	for ((i = 0; i + 2 < ${#deferred[@]}; i += 3)); do
		cached "${deferred[i + 1]}" "${deferred[i + 2]}" &&
			[ "$(jq -r .kv_type "${deferred[i + 1]}")" = f16 ] &&
			{ cp "${deferred[i + 1]}" "${deferred[i]}" || failed=1; }
	done
	deferred=()
}
in_list() { # in_list WORD LIST...: WORD is one of LIST
	local w=$1 x
	shift
	for x; do [ "$x" = "$w" ] && return 0; done
	return 1
}
render_only=${RESULTS_RENDER_ONLY:-0}
# policy_hash NAME: the source hash the binary holds (a cached cell of another hash is stale)
"$bin" info --json >"$out/info.json"
policy_hash() { jq -r --arg p "$1" '.policies[] | select(.name == $p) | .source_hash' "$out/info.json"; }
: >"$out/expected.cells"
# Lockstep passes (`BIN ppl --batch`) per text and protocol run every (policy, ratio) cell not
# cached yet: the weights are read once per token for all of a pass's runs, and the
# full-cache reference is computed once per pass. Streaming policies score every token;
# prompt-end policies get the first half as the prompt and score the tokens after it
# (--score-from).
ppl_cmd() { # ppl_cmd TEXTFILE GROUP: the pass command (without --batch) into cmd
	local pe=()
	[ "$2" = prompt_end ] && pe=(--prompt $((tokens / 2)) --score-from $((tokens / 2 + 1)))
	cmd=("$bin" ppl --model "$model" --text "$1" --ctx "$tokens" --threads "$threads" --json --chunk "$chunk"
		${pe[@]+"${pe[@]}"} ${fast[@]+"${fast[@]}"})
}
# Steps 3 and 4, text by text (a run stopped early has one text's sweep and frontier whole
# rather than two halves): the sweep's cells, then the frontier's. The byte frontier: every
# cell (policy, store type, ratio) whose bytes compression is in [fmin, fmax] (expected from
# the row size: f32 R/2, f16 R, q8_0 R·64/34), cached as frontier/{ppl,needle}/.../
# POLICY.KV.rR.json; a policy with its own precision runs in the default store (KV "own"),
# once ("r0") when it has no budget. On the fast path an f16 cell whose line the sweep runs
# is the sweep's cell, copied once the passes end (deferred).
has_budget() { grep -q '^[[:space:]]*budget[[:space:]]*=' "policies/$1.kvp"; }
fcells() { # fcells POLICY: "KV R" per line (a policy that rewrites f32 rows, `info`'s
	# kv_f32_only, GraceKV: its f32 cells only, the other stores being refused it)
	local p=$1 own=0 kv r kvs=$fkv
	jq -e --arg p "$p" 'any(.policies[]; .name == $p and .kv_f32_only)' "$out/info.json" >/dev/null && kvs=f32
	for q in $fown; do [ "$q" = "$p" ] && own=1; done
	if [ $own = 1 ]; then # a byte budget at each byte ratio in bounds, else its own budget once
		if byte_budget "$p"; then
			for r in $fratios; do
				awk -v r="$r" -v lo="$fmin" -v hi="$fmax" 'BEGIN { exit !(r >= lo * 0.999 && r <= hi * 1.001) }' && echo "own $r"
			done
		else
			echo "own 0"
		fi
		return
	fi
	for kv in $kvs; do
		for r in $fratios; do
			awk -v r="$r" -v k="$kv" -v lo="$fmin" -v hi="$fmax" 'BEGIN {
				f = k == "f32" ? 0.5 : k == "q8_0" ? 64 / 34 : 1; x = r * f
				exit !(x >= lo * 0.999 && x <= hi * 1.001) }' && echo "$kv $r"
		done
	done
}
frun() { # frun POLICY KV R N: the batch line of one frontier cell over N tokens of context
	local line=$1
	if [ "$2" = own ] && [ "$3" != 0 ]; then
		line="$line --byte-ratio $3"
	elif [ "$3" != 0 ]; then
		line="$line --ratio $3 $(extra_sets "$1" "$3" "$4")"
	fi
	[ "$2" != own ] && line="$line --kv-type $2"
	echo "$line"
}
for f in ${textfiles[@]+"${textfiles[@]}"}; do
	t=$(basename "$f" ".$tokens.txt")
	mkdir -p "$out/ppl/$t.$tokens"
	for group in stream prompt_end; do
		for p in $policies; do
			if prompt_end "$p"; then [ $group = prompt_end ] || continue; else [ $group = stream ] || continue; fi
			for r in $ratios; do
				j="$out/ppl/$t.$tokens/$p.r$r.json"
				expect "$j" "$p"
				cached "$j" "$p" && continue
				n=$tokens
				[ $group = prompt_end ] && n=$((tokens / 2))
				queue_cell "$p --ratio $r $(extra_sets "$p" "$r" "$n")" "$j"
			done
		done
		ppl_cmd "$f" $group
		queue_flush "ppl $t $group" "$out/ppl/$t.$tokens/$group" '"ppl \(.ppl) kld_mean \(.kld_mean)"' "${cmd[@]}"
	done
	d="$out/frontier/ppl/$t.$tokens"
	mkdir -p "$d"
	for group in $fprot; do
		for p in $fpolicies; do
			if prompt_end "$p"; then [ $group = prompt_end ] || continue; else [ $group = stream ] || continue; fi
			n=$tokens
			[ $group = prompt_end ] && n=$((tokens / 2))
			while read -r kv r; do
				j="$d/$p.$kv.r$r.json"
				expect "$j" "$p"
				cached "$j" "$p" && continue
				defer_sweep "$j" "$out/ppl/$t.$tokens/$p.r$r.json" "$p" "$kv" "$r" "$policies" "$ratios" && continue
				queue_cell "$(frun "$p" "$kv" "$r" "$n")" "$j"
			done < <(fcells "$p")
		done
		ppl_cmd "$f" $group
		queue_flush "frontier ppl $t $group" "$d/$group" '"x bytes \(.bytes_compression) kld_mean \(.kld_mean)"' "${cmd[@]}"
	done
done
phase_end
copy_deferred

# 5. passkey accuracy: `BIN needle --batch` per protocol (the streaming policies prefill
# token by token once their budget fills, the prompt-end ones and the full cache in large
# chunks), every (policy, ratio) cell not cached yet, one JSON file per cell
# the guard-only policies sized to the shortest length's budget
extra_sets_needle() { extra_sets "$1" "$2" "${lengths%%,*}"; }
nkey="L${lengths//,/-}.D${depths//,/-}"
mkdir -p "$out/needle/$nkey"
needle_cmd() { # needle_cmd TASK GROUP: the pass command (without --batch) into cmd; the
	# mode is the group's (question after the compressed prompt for prompt-end policies and
	# the full cache beside them), not left to which runs share the pass
	local mode=aware
	[ "$2" = prompt_end ] && mode=agnostic
	cmd=("$bin" needle --model "$model" --task "$1" --lengths "$lengths" --depths "$depths"
		--threads "$threads" --json --chunk "$chunk" --mode "$mode" ${fast[@]+"${fast[@]}"})
}
for group in stream prompt_end; do
	[ -n "$needle_ratios" ] && [ -n "$needle_policies" ] || break
	[ $group = prompt_end ] && expect "$out/needle/$nkey/full.json" full
	if [ $group = prompt_end ] && [ ! -s "$out/needle/$nkey/full.json" ]; then
		queue_cell "full" "$out/needle/$nkey/full.json"
	fi
	for r in $needle_ratios; do
		for p in $needle_policies; do
			if prompt_end "$p"; then [ $group = prompt_end ] || continue; else [ $group = stream ] || continue; fi
			j="$out/needle/$nkey/$p.r$r.json"
			expect "$j" "$p"
			cached "$j" "$p" && continue
			queue_cell "$p --ratio $r $(extra_sets_needle "$p" "$r")" "$j"
		done
	done
	needle_cmd passkey $group
	queue_flush "needle $group" "$out/needle/$nkey/$group" '"accuracy \(.accuracy)"' "${cmd[@]}"
done
phase_end

# 6. the frontier's retrieval: the full cache on the same prompts, once per task: the
# retrieval the frontier's cells are read against (for passkey the sweep's cell of step 5
# when it has one; else in the prompt-end pass, which like the full cache prefills in chunks,
# else in the only pass). Each task's cells go under frontier/needle/NKEY (passkey) or
# frontier/needle-TASK/NKEY.
mkdir -p "$out/frontier/needle/$nkey"
fullgroup=stream
case " $fprot " in *" prompt_end "*) fullgroup=prompt_end ;; esac
for task in $fntasks; do
	nd="$out/frontier/needle/$nkey"
	[ "$task" = passkey ] || nd="$out/frontier/needle-$task/$nkey"
	mkdir -p "$nd"
	for group in $fprot; do
		[ "$fneedle" = 1 ] || break
		if [ "$group" = $fullgroup ] && [ -n "$fnpolicies" ] && [ ! -s "$nd/full.json" ] &&
			{ [ "$task" != passkey ] || [ ! -s "$out/needle/$nkey/full.json" ]; }; then
			queue_cell "full" "$nd/full.json"
		fi
		for p in $fnpolicies; do
			if prompt_end "$p"; then [ $group = prompt_end ] || continue; else [ $group = stream ] || continue; fi
			while read -r kv r; do
				j="$nd/$p.$kv.r$r.json"
				expect "$j" "$p"
				cached "$j" "$p" && continue
				[ "$task" = passkey ] && defer_sweep "$j" "$out/needle/$nkey/$p.r$r.json" "$p" "$kv" "$r" "$needle_policies" "$needle_ratios" && continue
				queue_cell "$(frun "$p" "$kv" "$r" "${lengths%%,*}")" "$j"
			done < <(fcells "$p")
		done
		needle_cmd "$task" $group
		queue_flush "frontier needle $task $group" "$nd/$group" \
			'"accuracy \(.accuracy) x bytes \(.bytes_compression)"' "${cmd[@]}"
	done
done
phase_end
copy_deferred

# 7. render
wall=$(($(date +%s) - start))
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain 2>/dev/null | grep -v '^??' | grep -qv ' docs/results' && echo " (with uncommitted changes)" || true)
model_sha=$(sha256sum "$model" | cut -d' ' -f1)
RESULTS_SVGDIR=$svgdir RESULTS_NARROWED=$narrowed RESULTS_FAST=$RESULTS_FAST python3 "$here/render.py" "$out" "$doc" "$tokens" "$ratios" "$texts" "$policies" "$needle_policies" \
	"$needle_ratios" "$nkey" "$threads" "$commit$dirty" "$model" "$model_sha" "$wall" \
	"$cmdline" "$envline" "${RESULTS_NOTE:-}" \
	"$(for p in $policies; do prompt_end "$p" && printf '%s ' "$p"; done)"
[ "$frontier" = 1 ] && RESULTS_NARROWED=$narrowed RESULTS_FAST=$RESULTS_FAST RESULTS_NEEDLE_TASKS="$fntasks" python3 "$here/frontier.py" "$out" "$doc" "$svgdir" "$tokens" "$texts" \
	"$nkey" "$fpolicies" "$(for p in $fpolicies; do prompt_end "$p" && printf '%s ' "$p"; done)" \
	"$fprot" "$fmin" "$fmax"
if [ "$failed" = 1 ]; then
	echo "results.sh: a pass failed (its cells were not cached; its log: the .runs.err beside its .runs); rendered what the cache holds" >&2
	exit 1
fi
exit 0
