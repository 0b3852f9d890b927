# serve_lib.sh: shell helpers the served comparisons share (sourced, not run).

# wait_health: until $URL/health answers 200 (a server that just started
# loads its model first); fails after about two minutes.
wait_health() {
    for _ in $(seq 1 600); do
        curl -sf "$URL/health" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 1
}
