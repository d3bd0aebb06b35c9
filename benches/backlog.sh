#!/usr/bin/env bash
# Deliveries while `serve`'s relay drains a backlog: what a shop sees after its email was down
# for a while, or after a burst, with its providers still sending.
#
#   benches/backlog.sh [ROWS (200000)] [ROUNDS (2)] [OTHER_BINARY] [SECONDS (60)] [RATE (2000)]
#
# Fills a database with ROWS pending receipts (that many unique signed Stripe payments through
# `sekali serve --no-relay`), then, for each round, starts `sekali serve` as shops run it (the
# relay on, writing `.eml` files) on a fresh copy of it and offers RATE deliveries a second for
# SECONDS seconds (`sekali bench --rate`, 16 connections, 20 % racing redeliveries). Prints the
# deliveries' latencies and how long the relay took to send the backlog while they came (from
# the first `sent_at` to the last of the ROWS rows). With OTHER_BINARY, each round runs both
# builds on the same database (so OTHER_BINARY must know this build's schema version),
# alternating which goes first. Every run's files are kept until
# the end (see benches/relay_drain.sh on deleting many files), and each run starts from a synced
# page cache (see benches/throughput.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
rows=${1:-200000}
rounds=${2:-2}
other=${3:-}
seconds=${4:-60}
rate=${5:-2000}
case "$rows$rounds$seconds$rate" in
    *[!0-9]*) echo "usage: benches/backlog.sh [ROWS] [ROUNDS] [OTHER_BINARY] [SECONDS] [RATE] (whole numbers)" >&2; exit 2 ;;
esac

cargo build --release --quiet
bin=$PWD/target/release/sekali
export STRIPE_WEBHOOK_SECRET=whsec_backlog_c2VrYWxpLWJhY2tsb2c
make_work_dir

fill "$bin" "$work/backlog.db" "$rows"
pending=$(sqlite3 "$work/backlog.db" "SELECT count(*) FROM email_outbox WHERE status = 'pending'")
echo "backlog of $(git rev-parse --short HEAD): $pending pending emails, then $rate deliveries/s for $seconds s"
echo "label    p50_ms  p90_ms  p99_ms  max_ms  backlog_sent_in"

run() { # label binary round
    local label=$1 binary=$2 dir=$work/$1-$3 port server
    mkdir -p "$dir"
    cp "$work/backlog.db" "$dir/sekali.db"
    sync
    port=$(free_port)
    "$binary" serve --listen "127.0.0.1:$port" --db "$dir/sekali.db" --mail-dir "$dir/mail" \
        2> "$dir/serve.log" &
    server=$!
    wait_for_port "$port" "$server" "$dir/serve.log" || exit 1
    # The bench's own binary (this build) for both sides: the same load generator.
    "$bin" bench --url "http://127.0.0.1:$port/webhooks/stripe" --events $((rate * seconds)) \
        --rate "$rate" --concurrency 16 --max-seconds $((seconds + 30)) | head -1 > "$dir/report.json"
    kill -TERM "$server"
    wait "$server" || true
    python3 - "$label" "$dir/report.json" "$dir/sekali.db" "$pending" <<'EOF'
import json, sqlite3, sys
label, report, db, rows = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
r = json.load(open(report))
if r["non_2xx"] or r["errors"]:
    sys.exit(f"{label}: not every delivery was answered 2xx: {r['non_2xx']} {r['errors']} errors")
left, took = sqlite3.connect(db).execute(
    "SELECT sum(status = 'pending'), (julianday(max(sent_at)) - julianday(min(sent_at))) * 86400"
    " FROM email_outbox WHERE id <= ?", (rows,)).fetchone()
sent_in = f"{took:.1f} s" if not left else f"not done: {left} left"
print(f"{label:<8} {r['p50_ms']:7.2f} {r['p90_ms']:7.2f} {r['p99_ms']:7.2f} {r['max_ms']:7.2f}  {sent_in}")
EOF
}

for round in $(seq "$rounds"); do
    if [ -z "$other" ] || [ $((round % 2)) = 1 ]; then
        run this "$bin" "$round"
        [ -z "$other" ] || run other "$other" "$round"
    else
        run other "$other" "$round"
        run this "$bin" "$round"
    fi
done
