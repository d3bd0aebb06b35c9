#!/usr/bin/env bash
# Two builds of sekali, A and B, against the same load in one run, interleaved pair by pair so
# that the machine's drift falls on both: `sekali serve` as shops run it (the relay on, writing
# `.eml` files), EVENTS unique signed Stripe deliveries plus 20 % racing redeliveries at
# CONNECTIONS connections, every run checked with --check-db. One load generator (B's) drives
# both. Prints each run, then the median deliveries/s, p99 and max of each side and B/A. Each
# run's files are kept until the end (on ext4 without a journal, deleting many files slows the
# next runs: see make_work_dir in benches/lib.sh).
#
#   benches/ab.sh A_BINARY B_BINARY [PAIRS (4)] [EVENTS (100000)] [CONNECTIONS (64)] [-- SERVE_ARGS…]
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
a=$1
b=$2
pairs=${3:-4}
events=${4:-100000}
connections=${5:-64}
shift $(($# < 5 ? $# : 5))
[ "${1:-}" = "--" ] && shift
export STRIPE_WEBHOOK_SECRET=whsec_ab_c2VrYWxpLWFi
make_work_dir

run() { # side binary pair
    local side=$1 binary=$2 dir=$work/$1-$3 port server
    shift 3
    mkdir -p "$dir"
    port=$(free_port)
    # Nothing left dirty by the run before: the relay's syncfs would write it out, and this
    # run's commits would wait for it (see benches/throughput.rs).
    sync
    env -u RUST_LOG "$binary" serve --listen "127.0.0.1:$port" --db "$dir/sekali.db" \
        --mail-dir "$dir/mail" "$@" 2> "$dir/serve.log" &
    server=$!
    wait_for_port "$port" "$server" "$dir/serve.log" || exit 1
    "$b" bench --url "http://127.0.0.1:$port/webhooks/stripe" --events "$events" --dup-ratio 0.2 \
        --concurrency "$connections" --check-db "$dir/sekali.db" | head -1 > "$dir/report.json"
    kill -TERM "$server"
    wait "$server" || true
    python3 - "$side" "$dir/report.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[2]))
slowest = " ".join(f"{d['ms']:.0f}@{d['sent_at_s']:.1f}s" for d in r['slowest'])
print(f"{sys.argv[1]} {r['deliveries_per_sec']:.0f} {r['p99_ms']:.2f} {r['max_ms']:.2f} {r['check_db']} {slowest}")
EOF
}

echo "A: $a"
echo "B: $b"
echo "side deliveries/s p99_ms max_ms check_db slowest(ms@sent_at)"
for pair in $(seq "$pairs"); do
    if [ $((pair % 2)) = 1 ]; then
        run A "$a" "$pair" "$@" | tee -a "$work/results"
        run B "$b" "$pair" "$@" | tee -a "$work/results"
    else
        run B "$b" "$pair" "$@" | tee -a "$work/results"
        run A "$a" "$pair" "$@" | tee -a "$work/results"
    fi
done
python3 - "$work/results" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
med = {s: [statistics.median(float(r[i]) for r in rows if r[0] == s) for i in (1, 2, 3)] for s in "AB"}
for s in "AB":
    print(f"median {s}: {med[s][0]:.0f}/s  p99 {med[s][1]:.2f} ms  max {med[s][2]:.2f} ms")
print(f"B/A: deliveries/s {med['B'][0] / med['A'][0]:.3f}  p99 {med['B'][1] / med['A'][1]:.3f}")
EOF
