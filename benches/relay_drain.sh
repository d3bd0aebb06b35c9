#!/usr/bin/env bash
# How fast `sekali relay`, alone, drains a backlog of pending emails to `.eml` files.
#
#   benches/relay_drain.sh [ROWS (200000)] [ROUNDS (3)] [OTHER_BINARY]
#
# Fills a database with ROWS receipts (that many unique signed Stripe payments through
# `sekali serve --no-relay`, with `sekali bench`), then, for each round, drains a fresh copy of it
# with `sekali relay` into an empty mail directory and times it from its start to the last row's
# `sent_at`, as the relay recorded it. (A poll every half second, by a query that reads one index
# entry, tells when it is done. Polling every 50 ms with `sqlite3` took about a tenth of a core
# from the relay being timed, and counting the rows left took more.) With OTHER_BINARY (another build of sekali, even one from before the
# schema changed: it fills a database of its own the same way), each round runs both, alternating
# which goes first, so that the two are compared on the same disk in one run. Rows/s are ROWS
# over the drain time; peak RSS is the relay's VmHWM. The mail directory is on the same file
# system as the database (TMPDIR), as a shop's would be. Every round's files are kept until the
# run ends: on ext4 without a journal, deleting 200,000 files slows every file created for
# minutes after (seen here: drains fell from about 15,000 to about 3,000 rows/s for either build;
# see make_work_dir in benches/lib.sh), and so does a deletion shortly before the script starts.
set -euo pipefail
cd "$(dirname "$0")/.."
. benches/lib.sh
rows=${1:-200000}
rounds=${2:-3}
other=${3:-}

cargo build --release --quiet
bin=$PWD/target/release/sekali
export STRIPE_WEBHOOK_SECRET=whsec_drain_c2VrYWxpLWRyYWlu
make_work_dir

fill "$bin" "$work/this.db" "$rows"
[ -z "$other" ] || fill "$other" "$work/other.db" "$rows"
pending=$(sqlite3 "$work/this.db" "SELECT count(*) FROM email_outbox WHERE status = 'pending'")
echo "relay drain of $(git rev-parse --short HEAD): $pending pending rows, $rounds rounds"

drain() { # label binary round
    local label=$1 binary=$2 dir=$work/$1-$3 relay start end left peak now
    mkdir -p "$dir"
    cp "$work/$label.db" "$dir/sekali.db"
    sync
    start=$(date +%s.%N)
    "$binary" relay --db "$dir/sekali.db" --mail-dir "$dir/mail" 2> "$dir/relay.log" &
    relay=$!
    while :; do
        left=$(sqlite3 "$dir/sekali.db" "SELECT EXISTS (SELECT 1 FROM email_outbox WHERE status = 'pending')" 2>/dev/null || echo busy)
        [ "$left" = 0 ] && break
        if ! kill -0 "$relay" 2>/dev/null; then
            echo "$label: the relay exited with $left rows left; its log: $dir/relay.log" >&2
            exit 1
        fi
        sleep 0.5
    done
    now=$(date +%s.%N)
    peak=$(awk '/^VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$relay/status")
    kill -TERM "$relay"
    wait "$relay" || true
    files=$(find "$dir/mail" -name '*.eml' | wc -l)
    sent=$(sqlite3 "$dir/sekali.db" "SELECT count(*) FROM email_outbox WHERE status = 'sent'")
    end=$(sqlite3 "$dir/sekali.db" "SELECT (julianday(max(sent_at)) - 2440587.5) * 86400.0 FROM email_outbox")
    # The last row's sent_at is the relay's clock, which is this machine's: it cannot be later
    # than when the poll saw the backlog gone.
    awk -v e="$end" -v n="$now" -v s="$start" 'BEGIN { exit !(e > s && e <= n + 0.01) }' || {
        echo "$label: the last sent_at ($end) is not between the start ($start) and the poll ($now)" >&2
        exit 1
    }
    awk -v l="$label" -v s="$start" -v e="$end" -v n="$pending" -v f="$files" -v p="$peak" \
        'BEGIN { printf "%-8s %8.2f s %9.0f rows/s  %d files  peak RSS %d MiB\n", l, e - s, n / (e - s), f, p }'
    [ "$files" = "$pending" ] || { echo "$label: $files files for $pending rows" >&2; exit 1; }
    [ "$sent" = "$pending" ] || { echo "$label: $sent rows sent of $pending" >&2; exit 1; }
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
