"""The deployment recipes in ``deploy/`` parse, agree with each other and name real things.

A manifest that is never applied rots silently: a renamed setting, a moved socket or a typo
in a volume name would only show on someone's cluster. These tests read the files as the
tools would (systemd's INI dialect, YAML, TOML through our own config parser) and check the
joins between them: the socket path the agent listens on is the one the server is told, it
lies in a directory the unit or the pod provides, every ``VRAMSCOPE_*`` variable is a real
override, and every path the docs mention exists.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml
from vramscope.agent.config import env_var_name, parse_config
from vramscope.agent.settings import SETTINGS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy" / "systemd" / "vramscope-agent.service"
UNIT_CONFIG = ROOT / "deploy" / "systemd" / "vramscope.toml"
POD = ROOT / "deploy" / "kubernetes" / "vramscope-sidecar.yaml"
DOC = ROOT / "docs" / "deployment.md"
# The command docs/deployment.md installs ("Installing vramscope on a node"; run as written by
# tests/test_deploy_install.py), which the unit, the image and the pod start.
AGENT_COMMAND = "/opt/vramscope/bin/vramscope"

# Variables read by vramscope that are not settings overrides.
NON_SETTING_VARS = {"VRAMSCOPE_CONFIG"}
REAL_VARS = {env_var_name(s.key) for s in SETTINGS} | NON_SETTING_VARS


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax: [Section], Key=Value, '#'/';' comments, keys may repeat."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"line {n}: key outside a section: {raw!r}"
        assert "=" in line, f"line {n}: not Key=Value: {raw!r}"
        key, value = (part.strip() for part in line.split("=", 1))
        current.setdefault(key, []).append(value)
    return sections


def one(section: dict[str, list[str]], key: str) -> str:
    values = section.get(key)
    assert values is not None, f"missing {key}="
    assert len(values) == 1, f"{key}= given {len(values)} times"
    return values[0]


# --- systemd -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT.read_text())


def test_unit_has_the_sections_and_start_command(unit):
    assert set(unit) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    assert one(service, "ExecStart") == (
        f"{AGENT_COMMAND} agent --config /etc/vramscope/vramscope.toml")
    assert one(service, "Restart") == "on-failure"
    assert one(unit["Install"], "WantedBy") == "multi-user.target"


def test_unit_runs_unprivileged_and_hardened(unit):
    service = unit["Service"]
    assert one(service, "User") not in ("", "root", "0")
    assert "DynamicUser" not in service  # a dynamic uid no server shares could not connect
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict",
                       "ProtectHome": "yes", "PrivateTmp": "yes", "CapabilityBoundingSet": "",
                       "UMask": "0077"}.items():
        assert one(service, key) == value, key
    assert "PrivateDevices" not in service  # NVML needs /dev/nvidia*


def test_unit_provides_the_directories_the_config_uses(unit):
    """The socket lives in the unit's 0700 RuntimeDirectory, SQLite in its StateDirectory,
    and the config file that ExecStart names is in its ConfigurationDirectory."""
    service = unit["Service"]
    assert one(service, "RuntimeDirectory") == "vramscope"
    assert one(service, "RuntimeDirectoryMode") == "0700"
    config = parse_config(tomllib.loads(UNIT_CONFIG.read_text()), str(UNIT_CONFIG), environ={})
    socket_dir = PurePosixPath(config["agent.socket_path"]).parent
    assert socket_dir == PurePosixPath("/run") / one(service, "RuntimeDirectory")
    db_path = PurePosixPath(config["database.url"].removeprefix("sqlite:///"))
    assert db_path.parent == PurePosixPath("/var/lib") / one(service, "StateDirectory")
    config_arg = one(service, "ExecStart").split("--config ", 1)[1]
    assert PurePosixPath(config_arg) == (
        PurePosixPath("/etc") / one(service, "ConfigurationDirectory") / UNIT_CONFIG.name)


@pytest.mark.usefixtures("systemd_analyze")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    # verify insists that ExecStart's binary exists; point it at one that does.
    text = UNIT.read_text().replace(AGENT_COMMAND, sys.executable)
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""


# --- Kubernetes ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def k8s() -> dict[str, dict]:
    docs = list(yaml.safe_load_all(POD.read_text()))
    return {d["kind"]: d for d in docs}


def _containers(pod: dict) -> dict[str, dict]:
    spec = pod["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def _env(container: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _pod_config(k8s: dict, environ: dict[str, str] | None = None):
    text = k8s["ConfigMap"]["data"]["vramscope.toml"]
    return parse_config(tomllib.loads(text), "ConfigMap vramscope-config", environ or {})


def test_pod_manifest_kinds_and_sidecar(k8s):
    assert set(k8s) == {"ConfigMap", "Pod"}
    containers = _containers(k8s["Pod"])
    assert set(containers) == {"vramscope-agent", "inference"}
    agent = containers["vramscope-agent"]
    assert agent["restartPolicy"] == "Always"  # a native sidecar, started before the server
    assert agent["command"] == [AGENT_COMMAND, "agent", "--config",
                                "/etc/vramscope/vramscope.toml"]


def test_pod_sees_host_pids_and_requests_the_gpu(k8s):
    pod = k8s["Pod"]
    assert pod["spec"]["hostPID"] is True
    # The reason is written in the comment right above it.
    lines = POD.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "hostPID: true")
    comment = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("#"):
            break
        comment.append(line)
    reason = " ".join(comment)
    assert "NVML" in reason and "PID namespace" in reason, reason
    server = _containers(pod)["inference"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_both_containers_share_the_socket_through_an_emptydir(k8s):
    pod = k8s["Pod"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    config = _pod_config(k8s)
    socket_path = PurePosixPath(config["agent.socket_path"])
    for container in _containers(pod).values():
        assert _env(container)["VRAMSCOPE_AGENT_SOCKET_PATH"] == str(socket_path)
        mounts = [m for m in container["volumeMounts"]
                  if socket_path.is_relative_to(m["mountPath"])]
        assert len(mounts) == 1, container["name"]
        assert "emptyDir" in volumes[mounts[0]["name"]]
        # The agent makes its own 0700 directory inside the (0777) emptyDir.
        assert socket_path.parent != PurePosixPath(mounts[0]["mountPath"])
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000  # one uid: the peer check


def test_every_volume_mount_names_a_volume(k8s):
    pod = k8s["Pod"]
    volumes = {v["name"] for v in pod["spec"]["volumes"]}
    for container in _containers(pod).values():
        for mount in container["volumeMounts"]:
            assert mount["name"] in volumes, (container["name"], mount["name"])


def test_config_file_is_mounted_where_the_agent_reads_it(k8s):
    pod = k8s["Pod"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    agent = _containers(pod)["vramscope-agent"]
    config_path = PurePosixPath(agent["command"][agent["command"].index("--config") + 1])
    mount = next(m for m in agent["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    assert volumes[mount["name"]]["configMap"]["name"] == k8s["ConfigMap"]["metadata"]["name"]
    assert config_path.name in k8s["ConfigMap"]["data"]
    server_env = _env(_containers(pod)["inference"])
    assert server_env["VRAMSCOPE_CONFIG"] == str(config_path)
    db_path = PurePosixPath(_pod_config(k8s)["database.url"].removeprefix("sqlite:///"))
    assert any(db_path.is_relative_to(m["mountPath"]) for m in agent["volumeMounts"])


def test_agent_metrics_are_scrapable_at_the_pod_ip(k8s):
    # 127.0.0.1 inside a pod is the pod's own loopback: Prometheus reaches the pod's IP
    pod, config = k8s["Pod"], _pod_config(k8s)
    assert config["agent.metrics_host"] == "0.0.0.0"
    [port] = _containers(pod)["vramscope-agent"]["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", config["agent.metrics_port"])
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == str(config["agent.metrics_port"])
    assert notes["prometheus.io/path"] == "/metrics"


def test_pod_env_names_are_real_overrides_and_apply(k8s):
    pod = k8s["Pod"]
    names = {n for c in _containers(pod).values() for n in _env(c) if n.startswith("VRAMSCOPE_")}
    assert names == {"VRAMSCOPE_AGENT_SOCKET_PATH", "VRAMSCOPE_CONFIG",
                     "VRAMSCOPE_AGENT_HOST_NAME", "VRAMSCOPE_DATABASE_URL"}
    assert names <= REAL_VARS
    environ = {"VRAMSCOPE_AGENT_SOCKET_PATH": "/elsewhere/vramscope/agent.sock",
               "VRAMSCOPE_AGENT_HOST_NAME": "node-7",
               "VRAMSCOPE_DATABASE_URL": "postgresql+psycopg://db.example/vramscope"}
    config = _pod_config(k8s, environ)
    assert config["agent.socket_path"] == "/elsewhere/vramscope/agent.sock"
    assert config["agent.host_name"] == "node-7"
    assert config["database.url"] == "postgresql+psycopg://db.example/vramscope"


# --- docs ----------------------------------------------------------------------------------
def test_docs_name_real_files_and_variables():
    text = DOC.read_text()
    paths = set(re.findall(r"`((?:deploy|docs|tests|agent|hooks)/[\w./-]+)`", text))
    assert paths, "docs/deployment.md names no repository files"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert missing == []
    variables = set(re.findall(r"\bVRAMSCOPE_[A-Z_]+\b", text))
    assert {"VRAMSCOPE_AGENT_SOCKET_PATH", "VRAMSCOPE_CONFIG"} <= variables
    assert sorted(variables - REAL_VARS) == []


def test_the_command_the_docs_install_is_the_one_unit_image_and_pod_start():
    """The install block (run as written by tests/test_deploy_install.py, a slow test) makes
    the virtual environment whose ``vramscope`` the recipes start."""
    block = re.search(r"<!-- install-steps[^>]*-->\n```sh\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None
    venv = re.search(r"python3 -m venv (\S+)", block.group(1))
    assert venv is not None and f"{venv.group(1)}/bin/vramscope" == AGENT_COMMAND
    assert f"{venv.group(1)}/bin/pip install" in block.group(1)


def test_manifests_use_only_real_variable_names():
    for path in (UNIT, UNIT_CONFIG, POD):
        found = set(re.findall(r"\bVRAMSCOPE_[A-Z_]+\b", path.read_text()))
        assert sorted(found - REAL_VARS) == [], path.name


@pytest.mark.usefixtures("promtool")
def test_prometheus_scrape_config_is_valid(tmp_path):
    """deploy/prometheus/prometheus.yml, with the rules file it loads, passes promtool."""
    from vramscope.agent.alerts.prom_rules import render_rules
    from vramscope.agent.config import parse_config as _parse

    src = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    (tmp_path / "prometheus.yml").write_text(src.read_text())
    (tmp_path / "vramscope-rules.yml").write_text(render_rules(_parse({}, None, {})))
    done = subprocess.run(["promtool", "check", "config", "prometheus.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr


def test_container_image_copies_what_exists_and_runs_the_agent(k8s):
    text = (ROOT / "deploy" / "container" / "Dockerfile").read_text()
    # the build context's files (not what one stage copies from another, --from=)
    copies = [line.split()[1:-1] for line in text.splitlines()
              if line.startswith("COPY ") and not line.startswith("COPY --from=")]
    sources = [src for srcs in copies for src in srcs]
    assert "pyproject.toml" in sources and "migrations" in sources
    assert sorted(s for s in sources if not (ROOT / s).exists()) == []
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M).group(1)
    agent = _containers(k8s["Pod"])["vramscope-agent"]
    assert json.loads(cmd) == agent["command"]
    assert agent["command"][0] == AGENT_COMMAND
    assert f"python3 -m venv {AGENT_COMMAND.removesuffix('/bin/vramscope')}" in text
    assert "USER 1000:1000" in text  # the pod's runAsUser
