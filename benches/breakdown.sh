#!/usr/bin/env bash
# Where a delivery's time goes: the whole server at 64 connections, measured with parts of each
# delivery's database work removed, in alternating runs on this machine.
#
#   benches/breakdown.sh [ROUNDS (5)] [EVENTS (40000)] [CONNECTIONS (64)]
#
# Builds the committed tree (HEAD) with its benches/breakdown.patch applied, in a scratch copy
# under target/breakdown (its own target directory too). The patch adds SEKALI_BREAKDOWN, read
# once at startup; unset, the build behaves as sekali does:
#   full            everything sekali does (the patch not engaged)
#   claim-only      the dedupe claim (processed_events row with its payload), durable group
#                   commit; no payment facts, order, transition or email
#   no-commit-sync  everything, but synchronous=NORMAL on the writer: no fsync at COMMIT, so
#                   NOT durable; shows what the commit's fsync costs the whole loop
#   no-db           the database step removed: verify, parse, queue to the writer, empty
#                   transaction, answer
#   no-writer       the writer bypassed: verify, parse, answer (the issue's "HTTP only" line)
# These modes exist only in the patched scratch build, never in the shipped binary.
#
# Each run gets a fresh database (under target/breakdown, so on the disk the repository is on,
# not a tmpfs) and a fresh server; the load is the patched build's own `sekali bench` (20 %
# racing redeliveries). The order of the modes rotates from round to round, because this
# machine's speed drifts; each mode is compared with `full` of the same round, and the summary
# gives the median of those per-round ratios. A failed run stops the script with its logs kept.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
rounds=${1:-5}
events=${2:-40000}
connections=${3:-64}
case "$rounds$events$connections" in
    *[!0-9]*) echo "usage: benches/breakdown.sh [ROUNDS] [EVENTS] [CONNECTIONS] (whole numbers)" >&2; exit 2 ;;
esac
[ "$rounds" -ge 1 ] || { echo "ROUNDS must be at least 1" >&2; exit 2; }
repo=$PWD
[ -z "$(git status --porcelain)" ] || echo "note: uncommitted changes are not measured; this builds HEAD" >&2

base=$repo/target/breakdown
mkdir -p "$base"
scratch=$(mktemp -d -p "$base" run.XXXXXX)
server=
stop_server() {
    if [ -n "$server" ]; then
        kill "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
        server=
    fi
}
trap stop_server EXIT

git archive HEAD | tar -x -C "$scratch"
# Its own repository: inside this one (target/ is ignored here), `git apply` would skip every
# path outside the scratch directory, which is all of them, and say nothing.
git -C "$scratch" init --quiet
git -C "$scratch" apply benches/breakdown.patch
grep -q SEKALI_BREAKDOWN "$scratch/src/store/sqlite/events.rs" \
    || { echo "benches/breakdown.patch did not take; nothing measured" >&2; exit 1; }
(cd "$scratch" && cargo build --release --quiet --target-dir "$base")
bin=$base/release/sekali
echo "breakdown of $(git rev-parse --short HEAD): $rounds rounds of $events events at $connections connections"

export STRIPE_WEBHOOK_SECRET=whsec_breakdown_c2VrYWxp
modes=(full claim-only no-commit-sync no-db no-writer)
results=$scratch/results
for round in $(seq "$rounds"); do
    for slot in 0 1 2 3 4; do
        mode=${modes[$(( (slot + round - 1) % 5 ))]}
        dir=$scratch/round$round-$mode
        mkdir -p "$dir"
        port=$(free_port)
        env -u RUST_LOG SEKALI_BREAKDOWN="${mode/full/}" "$bin" serve --no-relay \
            --listen "127.0.0.1:$port" --db "$dir/b.db" 2> "$dir/server.log" &
        server=$!
        wait_for_port "$port" "$server" "$dir/server.log" || exit 1
        # The first line of the report is its JSON (read whole: `head -1` could cut the pipe).
        # `sekali bench` exits non-zero when a request failed in transport (refused, reset, no
        # answer) or was answered other than 2xx; that stops the script here, because such a
        # run is not a clean measurement.
        if ! report=$("$bin" bench --url "http://127.0.0.1:$port/webhooks/stripe" \
            --events "$events" --dup-ratio 0.2 --concurrency "$connections" --max-seconds 120 \
            2> "$dir/bench.err"); then
            echo "round $round $mode: the load generator failed; logs in $dir" >&2
            tail -5 "$dir/bench.err" "$dir/server.log" >&2
            exit 1
        fi
        stop_server
        line=${report%%$'\n'*}
        echo "$round $mode $line" >> "$results"
        echo "$line" | python3 -c "import json,sys; d=json.load(sys.stdin); print('round $round %-15s %8.0f/s  p99 %5.2f ms' % ('$mode', d['deliveries_per_sec'], d['p99_ms']))"
        rm -rf "$dir"
    done
done

python3 - "$results" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    round_, mode, rest = line.split(" ", 2)
    runs.setdefault(mode, {})[round_] = json.loads(rest)
full = runs["full"]
print()
print("%-15s %12s %22s %12s" % ("mode", "median /s", "median ratio to full", "median p99"))
for mode, by_round in runs.items():
    rate = statistics.median(r["deliveries_per_sec"] for r in by_round.values())
    ratio = statistics.median(
        r["deliveries_per_sec"] / full[k]["deliveries_per_sec"] for k, r in by_round.items())
    p99 = statistics.median(r["p99_ms"] for r in by_round.values())
    print("%-15s %12.0f %21.2fx %9.2f ms" % (mode, rate, ratio, p99))
EOF
rm -rf "$scratch"
