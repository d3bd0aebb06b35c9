# Shared by the benchmark scripts, which source it: `. "$(dirname "$0")/lib.sh"`.

# free_port: a TCP port on 127.0.0.1 that nothing listens on now.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_for_port PORT PID LOG: waits up to 10 s for PORT to accept connections; if the process
# PID exits first or the time runs out, prints the end of LOG (the server's) and fails.
wait_for_port() {
    local port=$1 pid=$2 log=$3
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "the server did not start on port $port; the end of its log, $log:" >&2
    tail -5 "$log" >&2
    return 1
}

# fill BINARY DB ROWS: ROWS unique signed Stripe payments through BINARY's `serve --no-relay`
# into DB (created), each leaving one pending receipt, checked with --check-db. The server's log
# is DB.serve.log, the load's report DB.fill.out.
fill() {
    local binary=$1 db=$2 rows=$3 port server
    port=$(free_port)
    "$binary" serve --no-relay --listen "127.0.0.1:$port" --db "$db" 2> "$db.serve.log" &
    server=$!
    wait_for_port "$port" "$server" "$db.serve.log" || exit 1
    "$binary" bench --url "http://127.0.0.1:$port/webhooks/stripe" --events "$rows" --dup-ratio 0 \
        --concurrency 64 --check-db "$db" > "$db.fill.out"
    kill -TERM "$server"
    wait "$server" || true
}

# make_work_dir: sets `work` to a new directory for the run's files (under TMPDIR), deleted when
# the script exits unless SEKALI_BENCH_KEEP=1, and stops the script's servers then. Deleting
# many files slows the next run that creates files on ext4 without a journal, which is what this
# machine's root file system is: it does not reuse an inode for 60 s after its deletion (360 s
# while its inode table block is unwritten), and every file created meanwhile checks past them
# (`recently_deleted` in the kernel's fs/ext4/ialloc.c). Measured here, draining 200,000 emails
# took 41 and 85 s instead of 10-15 s when each drain's directory was the one just deleted. So
# the next benchmark started within minutes of this one's cleanup measures that, not sekali:
# keep the files (and delete them when no benchmark follows) to compare runs of several scripts.
make_work_dir() {
    work=$(mktemp -d)
    trap bench_exit EXIT
    local device
    device=$(findmnt -n -o SOURCE -T "$work" 2>/dev/null | sed 's|^/dev/||')
    if [ -n "$device" ] && [ "$(cat "/sys/fs/ext4/$device/journal_task" 2>/dev/null)" = "<none>" ]; then
        echo "note: $work is on ext4 without a journal: runs that create files there within minutes of a large deletion are slowed by it (see benches/lib.sh)" >&2
    fi
}

# bench_exit: at the script's end, stops the PostgreSQL server start_postgres started and the
# script's other servers, and deletes the run's files (or says where they are kept).
bench_exit() {
    if [ -n "${pg_data:-}" ]; then
        "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_data" -m immediate stop >/dev/null 2>&1 || true
    fi
    kill $(jobs -p) 2>/dev/null || true
    # Servers a round started in a subshell (`for … done | tee`) that ended early under set -e
    # are not this shell's jobs: each names a path under $work on its command line.
    pkill -TERM -f -- "$work/" 2>/dev/null || true
    if [ "${SEKALI_BENCH_KEEP:-}" = 1 ]; then
        echo "the run's files are kept in $work" >&2
    else
        rm -rf "$work"
    fi
}

# start_postgres: a private PostgreSQL server in $work/pg (after make_work_dir), durable as
# sekali requires (fsync and synchronous_commit on), listening on a unix socket in $work only.
# Sets pg_bin, as_pg (the command prefix that runs its programs as the user postgres when this
# runs as root), pg_port, pg_data, and pg_host (the socket directory, percent-encoded for a URL:
# postgres://postgres@$pg_host:$pg_port/DB). pg_sql DB SQL runs SQL there.
start_postgres() {
    pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
    as_pg=()
    [ "$(id -u)" -eq 0 ] && { chown postgres "$work"; as_pg=(runuser -u postgres --); }
    pg_port=$(free_port)
    "${as_pg[@]}" "$pg_bin/initdb" -D "$work/pg" -A trust -U postgres --no-sync -E UTF8 --locale=C >/dev/null
    pg_data=$work/pg
    "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_data" -w -l "$work/pg.log" \
        -o "-k $work -p $pg_port -c listen_addresses='' -c fsync=on -c synchronous_commit=on -c max_connections=100 -c shared_buffers=256MB" start >/dev/null
    pg_host=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$work")
}

pg_sql() {
    "${as_pg[@]}" "$pg_bin/psql" -h "$work" -p "$pg_port" -U postgres -v ON_ERROR_STOP=1 -qc "$2" "$1"
}
