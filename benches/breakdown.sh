#!/usr/bin/env bash
# Where a delivery's time goes: the whole server at 64 connections, measured with parts of each
# delivery's database work removed, in alternating runs on this machine.
#
#   benches/breakdown.sh [ROUNDS (5)] [EVENTS (40000)] [CONNECTIONS (64)]
#
# Builds the committed tree (HEAD) with benches/breakdown.patch applied, in a scratch copy and
# its own target directory (target/breakdown). The patch adds SEKALI_BREAKDOWN, read once at
# startup; unset, the build behaves as sekali does:
#   full            everything sekali does (the patch not engaged)
#   claim-only      the dedupe claim (processed_events row with its payload), durable group
#                   commit; no order, transition, PaymentIntent link or email
#   no-commit-sync  everything, but synchronous=NORMAL on the writer: no fsync at COMMIT, so
#                   NOT durable; shows what the commit's fsync costs the whole loop
#   no-db           the database step removed: verify, parse, queue to the writer, empty
#                   transaction, answer
# These modes exist only in the patched scratch build, never in the shipped binary.
#
# Each run gets a fresh database and server; the load is the patched build's own `sekali bench`
# (20 % racing redeliveries). Prints every run, then the median rate and p99 of each mode.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
events=${2:-40000}
connections=${3:-64}
repo=$PWD

scratch=$(mktemp -d)
server=
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; fi
    rm -rf "$scratch"
}
trap cleanup EXIT

git archive HEAD | tar -x -C "$scratch"
git -C "$scratch" init --quiet
git -C "$scratch" apply "$repo/benches/breakdown.patch"
(cd "$scratch" && cargo build --release --quiet --target-dir "$repo/target/breakdown")
bin=$repo/target/breakdown/release/sekali

export STRIPE_WEBHOOK_SECRET=whsec_breakdown_c2VrYWxp
results=$scratch/results
for round in $(seq "$rounds"); do
    for mode in full claim-only no-commit-sync no-db; do
        dir=$(mktemp -d -p "$scratch")
        port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
        env -u RUST_LOG SEKALI_BREAKDOWN="${mode/full/}" "$bin" serve --no-relay \
            --listen "127.0.0.1:$port" --db "$dir/b.db" 2> "$dir/server.log" &
        server=$!
        for _ in $(seq 100); do
            (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
            sleep 0.1
        done
        # The first line of the report is its JSON (read whole: `head -1` could cut the pipe).
        report=$("$bin" bench --url "http://127.0.0.1:$port/webhooks/stripe" --events "$events" \
            --dup-ratio 0.2 --concurrency "$connections" --max-seconds 120 2>/dev/null)
        line=${report%%$'\n'*}
        kill "$server"
        wait "$server" 2>/dev/null || true
        server=
        echo "$mode $line" >> "$results"
        echo "$line" | python3 -c "import json,sys; d=json.load(sys.stdin); print('round $round %-15s %8.0f/s  p99 %5.2f ms  non-2xx %s  errors %d' % ('$mode', d['deliveries_per_sec'], d['p99_ms'], d['non_2xx'], d['errors']))"
        rm -rf "$dir"
    done
done

python3 - "$results" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    mode, rest = line.split(" ", 1)
    runs.setdefault(mode, []).append(json.loads(rest))
full = statistics.median(r["deliveries_per_sec"] for r in runs["full"])
print()
print("%-15s %12s %10s %12s" % ("mode", "median /s", "vs full", "median p99"))
for mode, rs in runs.items():
    rate = statistics.median(r["deliveries_per_sec"] for r in rs)
    p99 = statistics.median(r["p99_ms"] for r in rs)
    print("%-15s %12.0f %9.2fx %9.2f ms" % (mode, rate, rate / full, p99))
EOF
