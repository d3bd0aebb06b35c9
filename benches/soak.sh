#!/usr/bin/env bash
# Soak: a steady delivery rate for several minutes with the purge job deleting as fast as ids
# expire, sampling the server's memory, the WAL, the database file, and from its /metrics the
# relay's backlog and the writer's mean commit latency, every 10 seconds. Memory, the WAL and the backlog must stay flat; the database must plateau once the
# purge keeps pace.
#
#   benches/soak.sh [SECONDS (600)] [RATE per second (2000)] [CONNECTIONS (16)]
#
# Runs `sekali serve` as shops run it, the outbox relay on and writing `.eml` files, then the same
# soak with --no-relay as the second line. Uses the release binary and `sekali bench --rate` as
# the load; retention is shortened to 60 s and the purge runs every 15 s so that it deletes
# throughout the run.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
duration=${1:-600}
rate=${2:-2000}
connections=${3:-16}

# SEKALI_BIN: a binary to soak instead of this checkout's release build.
if [ -z "${SEKALI_BIN:-}" ]; then
    cargo build --release --quiet
fi
bin=${SEKALI_BIN:-$PWD/target/release/sekali}
export STRIPE_WEBHOOK_SECRET=whsec_soak_c2VrYWxpLXNvYWs
status=0
# Every soak's files are kept until the end: deleting the relay's million emails right before
# the `--no-relay` soak slowed it for minutes (ext4 without a journal: see make_work_dir in
# benches/lib.sh).
make_work_dir

soak() { # label, then extra serve arguments
    local label=$1
    shift
    local dir db port server load
    dir=$(mktemp -d -p "$work")
    db="$dir/soak.db"
    port=$(free_port)
    # Nothing left dirty by the build or the previous soak: the relay's syncfs would write it
    # out, and the deliveries' commits would wait for it (see benches/throughput.rs).
    sync
    "$bin" serve --listen "127.0.0.1:$port" --db "$db" --mail-dir "$dir/mail" --stripe-retention 60s \
        --purge-interval 15s "$@" 2> "$dir/server.log" &
    server=$!
    wait_for_port "$port" "$server" "$dir/server.log" || exit 1

    "$bin" bench --url "http://127.0.0.1:$port/webhooks/stripe" --events $((rate * duration)) \
        --dup-ratio 0.2 --rate "$rate" --concurrency "$connections" --max-seconds "$duration" \
        > "$dir/bench.out" 2> "$dir/bench.err" &
    load=$!

    mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
    size() { stat -c %s "$1" 2>/dev/null || echo 0; }
    # What the server's /metrics says, as an operator's Prometheus sees it.
    metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v s="$1" '$1 == s { print $2; found = 1 } END { if (!found) print "?" }'; }
    pending() { metric 'sekali_outbox_pending{outbox="email"}'; }
    local commits=0 commit_s=0
    # The mean commit latency since the last sample, from the histogram's count and sum, into
    # commit_ms_now (not in a subshell: it keeps the last sample's count and sum).
    commit_ms() {
        local c s
        c=$(metric sekali_writer_commit_duration_seconds_count)
        s=$(metric sekali_writer_commit_duration_seconds_sum)
        commit_ms_now=$(awk -v c="$c" -v s="$s" -v c0="$commits" -v s0="$commit_s" \
            'BEGIN { if (c > c0) printf "%.2f", (s - s0) / (c - c0) * 1000; else print "-" }')
        commits=$c commit_s=$s
    }
    echo "== $label"
    printf '%6s %9s %9s %9s %9s %10s %9s %10s\n' seconds rss_mib hwm_mib wal_mib db_mib event_rows backlog commit_ms
    local start
    start=$(date +%s)
    while kill -0 "$load" 2>/dev/null; do
        sleep 10
        rss=$(awk '/^VmRSS/ { print $2 * 1024 }' "/proc/$server/status")
        hwm=$(awk '/^VmHWM/ { print $2 * 1024 }' "/proc/$server/status")
        rows=$(sqlite3 "$db" 'SELECT count(*) FROM processed_events' 2>/dev/null || echo '?')
        commit_ms
        printf '%6d %9s %9s %9s %9s %10s %9s %10s\n' $(( $(date +%s) - start )) "$(mib "$rss")" "$(mib "$hwm")" \
            "$(mib "$(size "$db-wal")")" "$(mib "$(size "$db")")" "$rows" "$(pending)" "$commit_ms_now"
    done
    # sekali bench exits non-zero unless every request was answered 2xx; the soak then fails too.
    local result=0
    wait "$load" || result=$?
    local ended drained=-
    ended=$(date +%s.%N)
    case " $* " in
    *" --no-relay "*) ;;
    *)
        while [ "$(pending)" != "0" ]; do sleep 0.1; done
        drained=$(awk -v a="$ended" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
        ;;
    esac
    echo
    cat "$dir/bench.out"
    echo "backlog at the end of the load drained in: $drained s; emails sent: $(sqlite3 "$db" "SELECT count(*) FROM email_outbox WHERE status = 'sent'")"
    # grep finds no purge in a soak shorter than the purge interval: not a failure.
    echo "purge passes logged: $(grep -c "purged" "$dir/server.log" || true)"
    { grep "purged" "$dir/server.log" || true; } | tail -2
    if [ "$result" -ne 0 ]; then
        echo "the soak failed: $(cat "$dir/bench.err")" >&2
        status=$result
    fi
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
}

soak "sekali serve (default: relay on, .eml)"
soak "sekali serve --no-relay" --no-relay
exit "$status"
