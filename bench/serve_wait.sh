# Sourced by the serving benchmarks (compare_serve.sh, serve_ratio.sh).
# wait_ready PORT PID: waits up to 60 s for the server PID on 127.0.0.1:PORT to answer
# /health with 200; fails at once if the process exits.
wait_ready() {
  local port="$1" pid="$2"
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && return 0
    kill -0 "$pid" 2> /dev/null || { echo "server exited" >&2; return 1; }
    sleep 0.5
  done
  echo "server not ready" >&2; return 1
}
