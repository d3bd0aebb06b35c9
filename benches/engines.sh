#!/usr/bin/env bash
# The two engines side by side in one run: `sekali serve` as shops run it (the relay on, writing
# `.eml` files) on its embedded SQLite default, on PostgreSQL with one instance, and with two
# instances on the same database behind the load generator's round robin: with the default two
# writers each (pg2), and with one each (pg2w1, `--pg-writers 1`: as many writers in all as one
# instance has, so batches as big as its). EVENTS unique signed Stripe deliveries plus 20 %
# racing redeliveries at CONNECTIONS connections, every run checked with --check-db, the four
# interleaved run by run so that the machine's drift falls on all. PostgreSQL is a private
# server this script starts (initdb into the run's directory, fsync and synchronous_commit on,
# as the issue's prototype measured it: on the same 2 cores), connected over its unix socket.
# Prints each run, then the medians and the ratios to SQLite, with each side's CPU per delivery
# over the load: all the machine's, sekali's own (its /metrics' process_cpu_seconds_total, every
# instance), the load generator's, and the rest (PostgreSQL's server; on SQLite, the kernel's
# own threads, writing back the disk). Once the cores are busy, the cores' seconds over the CPU
# per delivery is the most deliveries a second there can be.
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

# run SIDE ROUND INSTANCES [SERVE OPTIONS]: one load against INSTANCES servers on SIDE's database.
run() {
    local side=$1 round=$2 instances=$3 dir=$work/$1-$2 db urls=() servers=()
    shift 3
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
            --mail-dir "$dir/mail$i" "$@" 2> "$dir/serve$i.log" &
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
# CPU per delivery answered 2xx, in microseconds, over the load: the machine's busy time, the
# servers' own (their process_cpu_seconds_total), bench's, and the rest (PostgreSQL's server).
cpu, n = r["machine_cpu"], r["ok_2xx"]
servers = sum(m["cpu_seconds"] for m in r["server_metrics"])
us = lambda s: s * 1e6 / n
print(f"{sys.argv[1]} {r['deliveries_per_sec']:.0f} {r['p99_ms']:.2f} {r['max_ms']:.2f} {r['check_db']}"
      f" {us(cpu['busy_seconds']):.0f} {us(servers):.0f} {us(cpu['bench_seconds']):.0f}"
      f" {us(cpu['busy_seconds'] - servers - cpu['bench_seconds']):.0f}"
      f" {100 * cpu['busy_seconds'] / (cpu['busy_seconds'] + cpu['idle_seconds']):.0f}")
PY
}

echo "binary: $bin; $events events, $connections connections, $rounds rounds"
echo "side deliveries/s p99_ms max_ms check_db cpu_us sekali_us bench_us rest_us busy_%"
for round in $(seq "$rounds"); do
    run sqlite "$round" 1
    run pg1 "$round" 1
    run pg2 "$round" 2
    run pg2w1 "$round" 2 --pg-writers 1
done | tee "$work/runs.txt"
python3 - "$work/runs.txt" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    side, rate, p99, _, _, cpu, sekali, bench, rest, busy = line.split()
    runs.setdefault(side, []).append([float(v) for v in (rate, p99, cpu, sekali, bench, rest, busy)])
med = {s: [statistics.median(r[i] for r in v) for i in range(7)] for s, v in runs.items()}
for side, (rate, p99, cpu, sekali, bench, rest, busy) in med.items():
    print(f"median {side}: {rate:.0f} deliveries/s, p99 {p99:.2f} ms, {rate / med['sqlite'][0]:.2f} x sqlite;"
          f" CPU per delivery {cpu:.0f} us (sekali {sekali:.0f}, bench {bench:.0f}, the rest {rest:.0f}),"
          f" {busy:.0f} % busy")
if "pg1" in med and "pg2" in med:
    print(f"two instances / one: {med['pg2'][0] / med['pg1'][0]:.2f}; with one writer each: {med['pg2w1'][0] / med['pg1'][0]:.2f}")
PY
