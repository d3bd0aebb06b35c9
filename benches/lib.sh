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
