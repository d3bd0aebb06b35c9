#!/usr/bin/env bash
# How far PostgreSQL itself goes on this machine with the rows sekali writes, beside sekali in
# the same run: the bound on what any sekali could reach here on PostgreSQL.
#
# Each round, on one private server (benches/lib.sh's start_postgres: fsync and
# synchronous_commit on, over its unix socket, on the same cores):
# - sekali: `serve` as shops run it (the relay on, writing `.eml` files), EVENTS unique signed
#   Stripe payments (no redeliveries: each one new order's rows) at CONNECTIONS connections,
#   checked with --check-db;
# - rows, set: pgbench writing the same rows for new paid orders (benches/pg_rows.sql: the claim
#   with its body, the payment, the order, its change, its email; then the relay's lease and its
#   results with their attempts) into sekali's schema, a batch per transaction in one statement
#   per table, with as many clients as sekali has writers (4) and as many deliveries in flight
#   as the load's connections (batch = CONNECTIONS / 4): no HTTP, no signatures, no reads, no
#   load generator;
# - rows, each: the same rows and transactions, one statement per row (as sekali writes them).
# Prints each run, then the medians and the ratios.
#
#   benches/pg_ceiling.sh BINARY [ROUNDS (2)] [SECONDS (15)] [EVENTS (30000)] [CONNECTIONS (64)]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
bin=$(realpath "$1")
rounds=${2:-2}
seconds=${3:-15}
events=${4:-30000}
connections=${5:-64}
writers=4 # sekali's writers per instance (DEFAULT_WRITERS in src/store/postgres/writer.rs)
batch=$((connections / writers))
export STRIPE_WEBHOOK_SECRET=whsec_ab_c2VrYWxpLWFi
make_work_dir
start_postgres
cp src/store/postgres/schema.sql benches/pg_rows.sql "$work/"
# The per-row form: each statement of the batch repeated for each delivery alone.
awk -v b="$batch" 'BEGIN { RS = ""; ORS = "\n\n" }
    /generate_series\(1, :b\)/ {
        for (k = 1; k <= b; k++) { p = $0; gsub(/generate_series\(1, :b\)/, "generate_series(" k ", " k ")", p); print p }
        next
    }
    { print }' "$work/pg_rows.sql" > "$work/pg_rows_each.sql"
chmod 644 "$work"/*.sql

# sekali ROUND
sekali() {
    local dir=$work/sekali-$1 port server
    mkdir -p "$dir"
    chmod 777 "$dir"
    pg_sql postgres "CREATE DATABASE sekali_$1"
    local db="postgres://postgres@$pg_host:$pg_port/sekali_$1"
    port=$(free_port)
    env -u RUST_LOG "$bin" serve --listen "127.0.0.1:$port" --db "$db" --mail-dir "$dir/mail" \
        2> "$dir/serve.log" &
    server=$!
    wait_for_port "$port" "$server" "$dir/serve.log" || exit 1
    "$bin" bench --url "http://127.0.0.1:$port/webhooks/stripe" --events "$events" --dup-ratio 0 \
        --concurrency "$connections" --check-db "$db" | head -1 > "$dir/report.json"
    kill -TERM "$server"
    wait "$server" || true
    python3 - "$dir/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"sekali {r['deliveries_per_sec']:.0f} {r['p99_ms']:.2f} {r['check_db']}")
PY
}

# rows FORM ROUND: pgbench with the FORM script (set or each) into a new database.
rows() {
    local form=$1 database=rows_$1_$2 script=$work/pg_rows.sql
    [ "$form" = each ] && script=$work/pg_rows_each.sql
    pg_sql postgres "CREATE DATABASE $database"
    "${as_pg[@]}" "$pg_bin/psql" -h "$work" -p "$pg_port" -U postgres -v ON_ERROR_STOP=1 -q \
        -f "$work/schema.sql" "$database" >/dev/null
    # Prepared, as sekali's statements are. A prepared statement's plan is made for any
    # parameters once the table has rows but no statistics yet, and PostgreSQL then scans the
    # whole outbox for the relay's updates, which sekali's statements never do (its runs show
    # index scans only): kept off that path.
    "${as_pg[@]}" env PGOPTIONS="-c enable_seqscan=off" "$pg_bin/pgbench" -h "$work" -p "$pg_port" -U postgres -n -M prepared -c "$writers" \
        -j "$writers" -T "$seconds" -D b="$batch" -f "$script" "$database" > "$work/$database.out" 2>&1
    python3 - "$form" "$batch" "$work/$database.out" <<'PY'
import re, sys
text = open(sys.argv[3]).read()
tps = float(re.search(r"tps = ([0-9.]+)", text).group(1))
latency = float(re.search(r"latency average = ([0-9.]+) ms", text).group(1))
failed = int(re.search(r"number of failed transactions: (\d+)", text).group(1))
print(f"rows-{sys.argv[1]} {tps * int(sys.argv[2]):.0f} {latency:.2f} failed={failed}")
PY
}

echo "binary: $bin; sekali: $events events at $connections connections; pgbench: $seconds s, $writers clients, batches of $batch; $rounds rounds"
echo "side deliveries/s latency_ms (sekali: p99 of a delivery; pgbench: average of the three transactions) check"
for round in $(seq "$rounds"); do
    sekali "$round"
    rows set "$round"
    rows each "$round"
done | tee "$work/runs.txt"
python3 - "$work/runs.txt" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    side, rate, *_ = line.split()
    runs.setdefault(side, []).append(float(rate))
med = {side: statistics.median(rates) for side, rates in runs.items()}
for side, rate in med.items():
    print(f"median {side}: {rate:.0f} deliveries/s, {rate / med['rows-set']:.2f} x rows-set")
PY
