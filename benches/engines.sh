#!/usr/bin/env bash
# The two engines side by side in one run: `sekali serve` as shops run it (the relay on, writing
# `.eml` files) on its embedded SQLite default, on PostgreSQL with one instance, and with two
# instances on the same database behind the load generator's round robin; EVENTS unique signed
# Stripe deliveries plus 20 % racing redeliveries at CONNECTIONS connections, every run checked
# with --check-db, the three interleaved run by run so that the machine's drift falls on all.
# PostgreSQL is a private server this script starts (initdb into the run's directory, fsync and
# synchronous_commit on, as the issue's prototype measured it: on the same 2 cores), connected
# over its unix socket. Prints each run, then the medians and the ratios to SQLite.
#
#   benches/engines.sh BINARY [ROUNDS (3)] [EVENTS (100000)] [CONNECTIONS (64)]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
bin=$(realpath "$1")
rounds=${2:-3}
events=${3:-100000}
connections=${4:-64}
export STRIPE_WEBHOOK_SECRET=whsec_ab_c2VrYWxpLWFi
make_work_dir
start_postgres

# run SIDE ROUND INSTANCES: one load against INSTANCES servers on SIDE's database.
run() {
    local side=$1 round=$2 instances=$3 dir=$work/$1-$2 db urls=() servers=()
    mkdir -p "$dir"
    chmod 777 "$dir"
    if [ "$side" = sqlite ]; then
        db=$dir/sekali.db
    else
        pg_sql postgres "CREATE DATABASE r_${side}_$round"
        db="postgres://postgres@$pg_host:$pg_port/r_${side}_$round"
    fi
    sync
    for i in $(seq "$instances"); do
        local port
        port=$(free_port)
        env -u RUST_LOG "$bin" serve --listen "127.0.0.1:$port" --db "$db" \
            --mail-dir "$dir/mail$i" 2> "$dir/serve$i.log" &
        servers+=($!)
        wait_for_port "$port" "$!" "$dir/serve$i.log" || exit 1
        urls+=(--url "http://127.0.0.1:$port/webhooks/stripe")
    done
    "$bin" bench "${urls[@]}" --events "$events" --dup-ratio 0.2 \
        --concurrency "$connections" --check-db "$db" | head -1 > "$dir/report.json"
    kill -TERM "${servers[@]}"
    wait "${servers[@]}" || true
    python3 - "$side" "$dir/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
print(f"{sys.argv[1]} {r['deliveries_per_sec']:.0f} {r['p99_ms']:.2f} {r['max_ms']:.2f} {r['check_db']}")
PY
}

echo "binary: $bin; $events events, $connections connections, $rounds rounds"
echo "side deliveries/s p99_ms max_ms check_db"
for round in $(seq "$rounds"); do
    run sqlite "$round" 1
    run pg1 "$round" 1
    run pg2 "$round" 2
done | tee "$work/runs.txt"
python3 - "$work/runs.txt" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    side, rate, p99, *_ = line.split()
    runs.setdefault(side, []).append((float(rate), float(p99)))
med = {s: (statistics.median(r for r, _ in v), statistics.median(p for _, p in v)) for s, v in runs.items()}
for side, (rate, p99) in med.items():
    print(f"median {side}: {rate:.0f} deliveries/s, p99 {p99:.2f} ms, {rate / med['sqlite'][0]:.2f} x sqlite")
if "pg1" in med and "pg2" in med:
    print(f"two instances / one: {med['pg2'][0] / med['pg1'][0]:.2f}")
PY
