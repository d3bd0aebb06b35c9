#!/usr/bin/env bash
# Soak: a steady delivery rate for several minutes with the purge job deleting as fast as ids
# expire, sampling the server's memory, the WAL and the database file every 10 seconds.
# Memory and the WAL must stay flat; the database must plateau once the purge keeps pace.
#
#   benches/soak.sh [SECONDS (600)] [RATE per second (2000)] [CONNECTIONS (16)]
#
# Uses the release binary and `sekali bench --rate` as the load; retention is shortened to 60 s
# and the purge runs every 15 s so that it deletes throughout the run.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-600}
rate=${2:-2000}
connections=${3:-16}

cargo build --release --quiet
bin=target/release/sekali
dir=$(mktemp -d)
db="$dir/soak.db"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export STRIPE_WEBHOOK_SECRET=whsec_soak_c2VrYWxpLXNvYWs

"$bin" serve --no-relay --listen "127.0.0.1:$port" --db "$db" --stripe-retention 60s --purge-interval 15s \
    2> "$dir/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done

"$bin" bench --url "http://127.0.0.1:$port/webhooks/stripe" --events $((rate * duration)) \
    --dup-ratio 0.2 --rate "$rate" --concurrency "$connections" --max-seconds "$duration" > "$dir/bench.out" 2> "$dir/bench.err" &
load=$!

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
size() { stat -c %s "$1" 2>/dev/null || echo 0; }
printf '%6s %9s %9s %9s %9s %10s\n' seconds rss_mib hwm_mib wal_mib db_mib event_rows
start=$(date +%s)
while kill -0 "$load" 2>/dev/null; do
    sleep 10
    rss=$(awk '/^VmRSS/ { print $2 * 1024 }' "/proc/$server/status")
    hwm=$(awk '/^VmHWM/ { print $2 * 1024 }' "/proc/$server/status")
    rows=$("$bin" events list --db "$db" --limit 0 >/dev/null 2>&1 && sqlite3 "$db" 'SELECT count(*) FROM processed_events' 2>/dev/null || echo '?')
    printf '%6d %9s %9s %9s %9s %10s\n' $(( $(date +%s) - start )) "$(mib "$rss")" "$(mib "$hwm")" \
        "$(mib "$(size "$db-wal")")" "$(mib "$(size "$db")")" "$rows"
done
# sekali bench exits non-zero unless every request was answered 2xx; the soak then fails too.
status=0
wait "$load" || status=$?
echo
cat "$dir/bench.out"
grep -c "purged" "$dir/server.log" | xargs -I{} echo "purge passes logged: {}"
grep "purged" "$dir/server.log" | tail -3
if [ "$status" -ne 0 ]; then
    echo "the soak failed: $(cat "$dir/bench.err")" >&2
fi
exit "$status"
