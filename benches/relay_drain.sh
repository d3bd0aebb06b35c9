#!/usr/bin/env bash
# How fast `sekali relay`, alone, drains a backlog of pending emails to `.eml` files.
#
#   benches/relay_drain.sh [ROWS (200000)] [ROUNDS (3)] [OTHER_BINARY]
#
# Fills one database with ROWS receipts (that many unique signed Stripe payments through
# `sekali serve --no-relay`, with `sekali bench`), then, for each round, drains a fresh copy of it
# with `sekali relay` into an empty mail directory and times it from start to the last row `sent`
# (polled with sqlite3 every 50 ms). With OTHER_BINARY (another build of sekali), each round runs
# both, alternating which goes first, so that the two are compared on the same disk in one run.
# Rows/s are ROWS over the drain time; the mail directory is on the same file system as the
# database (TMPDIR), as a shop's would be. Every round's files are kept until the run ends: on a
# file system mounted with `discard`, deleting 200,000 files slows every file created for a
# while after (seen here: drains fell from about 15,000 to about 3,000 rows/s for either build).
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-200000}
rounds=${2:-3}
other=${3:-}

cargo build --release --quiet
bin=$PWD/target/release/sekali
export STRIPE_WEBHOOK_SECRET=whsec_drain_c2VrYWxpLWRyYWlu
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" serve --no-relay --listen "127.0.0.1:$port" --db "$work/filled.db" 2> "$work/serve.log" &
server=$!
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done
"$bin" bench --url "http://127.0.0.1:$port/webhooks/stripe" --events "$rows" --dup-ratio 0 \
    --concurrency 64 --check-db "$work/filled.db" > "$work/fill.out"
kill -TERM "$server"
wait "$server" || true
pending=$(sqlite3 "$work/filled.db" "SELECT count(*) FROM email_outbox WHERE status = 'pending'")
echo "relay drain of $(git rev-parse --short HEAD): $pending pending rows, $rounds rounds"

drain() { # label binary round
    local label=$1 binary=$2 dir=$work/$1-$3 relay start end left
    mkdir -p "$dir"
    cp "$work/filled.db" "$dir/sekali.db"
    sync
    start=$(date +%s.%N)
    "$binary" relay --db "$dir/sekali.db" --mail-dir "$dir/mail" 2> "$dir/relay.log" &
    relay=$!
    while :; do
        left=$(sqlite3 "$dir/sekali.db" "SELECT count(*) FROM email_outbox WHERE status <> 'sent'" 2>/dev/null || echo busy)
        [ "$left" = 0 ] && break
        if ! kill -0 "$relay" 2>/dev/null; then
            echo "$label: the relay exited with $left rows left; its log: $dir/relay.log" >&2
            exit 1
        fi
        sleep 0.05
    done
    end=$(date +%s.%N)
    kill -TERM "$relay"
    wait "$relay" || true
    files=$(find "$dir/mail" -name '*.eml' | wc -l)
    awk -v l="$label" -v s="$start" -v e="$end" -v n="$pending" -v f="$files" \
        'BEGIN { printf "%-8s %8.2f s %9.0f rows/s  %d files\n", l, e - s, n / (e - s), f }'
    [ "$files" = "$pending" ] || { echo "$label: $files files for $pending rows" >&2; exit 1; }
}

for round in $(seq "$rounds"); do
    if [ -z "$other" ]; then
        drain this "$bin" "$round"
    elif [ $((round % 2)) = 1 ]; then
        drain this "$bin" "$round"
        drain other "$other" "$round"
    else
        drain other "$other" "$round"
        drain this "$bin" "$round"
    fi
done
