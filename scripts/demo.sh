#!/usr/bin/env bash
# `make demo`: a control plane on the embedded SQLite store in a throw-away RIGBASE_HOME, walked
# through provider → region → nodes added by minion_id, a refused bad input, maintenance and history.
# Every command is printed before it runs. The join issue turns this into the full local lab
# (real minions with software TPMs instead of the simulated join step below).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
PROVISION=.venv/bin/provision

export RIGBASE_HOME
RIGBASE_HOME=$(mktemp -d -t rigbase-demo-XXXXXX)
unset RIGBASE_DATABASE_URL RIGBASE_URL RIGBASE_TOKEN
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

server=""
cleanup() {
  if [[ -n $server ]]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$RIGBASE_HOME"
}
trap cleanup EXIT

step() { printf '\n\033[1m$ provision %s\033[0m\n' "$*"; "$PROVISION" "$@"; }
refused() {
  printf '\n\033[1m$ provision %s\033[0m   # expected to be refused\n' "$*"
  local rc=0
  "$PROVISION" "$@" || rc=$?
  if ((rc == 0)); then echo "demo: this should have been refused" >&2; exit 1; fi
  echo "(exit $rc: refused, nothing changed)"
}

printf '\033[1m$ provision serve --port %s\033[0m   # RIGBASE_HOME=%s\n' "$PORT" "$RIGBASE_HOME"
"$PROVISION" serve --port "$PORT" > "$RIGBASE_HOME/server.log" 2>&1 &
server=$!
$PY - "$PORT" <<'PYEOF'
import sys, time, httpx
for _ in range(300):
    try:
        if httpx.get(f"http://127.0.0.1:{sys.argv[1]}/healthz", timeout=1).status_code == 200:
            sys.exit(0)
    except httpx.TransportError:
        time.sleep(0.1)
sys.exit("demo: the control plane did not start")
PYEOF
cat "$RIGBASE_HOME/server.log"

step provider enable physical
step provider list
step region create lab-1 --provider physical
step region create studio --provider physical --storage-mode central --no-public-jobs
step region list
step node add gpu-1 --region lab-1 --minion-id 3f9a1c0e5b7d2468ace0135792468bdf
step node add gpu-2 --region lab-1 --minion-id 0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e --no-upnp
step node add nas-1 --region lab-1 --minion-id 9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b --service storage
refused node add gpu-3 --region lab-1 --minion-id 3f9a1c0e5b7d2468ace0135792468bdf
refused node add GPU_3 --region lab-1 --minion-id 1111111111111111aaaaaaaaaaaaaaaa
refused node add gpu-9 --region studio --minion-id 2222222222222222bbbbbbbbbbbbbbbb
refused node maintenance gpu-1 off
step node list

# Until the join issue lands, the minion's side (enrolling → provisioning → maintenance) is
# simulated here through the same service function the join routes will call.
printf '\n# simulating gpu-1 joining (the join issue replaces this with a real minion)\n'
$PY - <<'PYEOF'
from provisioner.config import database_url
from provisioner.services import nodes
from provisioner.states import NodeState
from provisioner.store.engine import make_engine, make_sessionmaker

with make_sessionmaker(make_engine(database_url())).begin() as s:
    node = nodes.get(s, "gpu-1")
    for state in (NodeState.ENROLLING, NodeState.PROVISIONING, NodeState.MAINTENANCE):
        nodes.transition(s, node, state, actor="minion:3f9a1c0e5b7d2468ace0135792468bdf", reason="simulated join")
    nodes.record_report(s, node, inventory={"gpus": 2, "gpu_model": "RTX 4090"}, requirements={"verdict": "pass"})
PYEOF
step node maintenance gpu-1 off
step node maintenance gpu-1 on
step node history gpu-1
step node show gpu-1 --json
step node list --region lab-1
printf '\ndemo done: stopping the control plane\n'
