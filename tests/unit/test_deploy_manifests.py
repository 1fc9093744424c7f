"""deploy/compose, deploy/k8s, deploy/slurm and the Dockerfile: they parse, hold the required fields, run
commands the CLI accepts and vLLM commands that match turnstream/vllm_server.py, with run configurations
that load, and never expose vLLM's development routes."""
from __future__ import annotations

import functools
import re
import shlex
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest
import yaml

from turnstream.cli import build_parser
from turnstream.core.config import Config, VllmSection
from turnstream.core.configtools import from_dict
from turnstream.keygen import main as keygen_main
from turnstream.preflight import preflight
from turnstream.vllm_server import vllm_command

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ROLE_COMMANDS = {"buffer", "learner", "actor"}


def validate_config(data: dict) -> Config:
    net = data.get("network", {})
    if net.get("keys_dir"):
        # the keys exist only where the manifest mounts them: stand in a directory keygen made here
        data = {**data, "network": {**net, "keys_dir": str(_generated_keys())}}
    return preflight(from_dict(Config, data))


@functools.cache
def _generated_keys() -> Path:
    directory = Path(tempfile.mkdtemp(prefix="turnstream-keys-"))
    keygen_main(directory)
    return directory


def parse_cli(argv: list[str]):
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"the CLI rejects: turnstream {' '.join(argv)}")


def check_vllm_args(args: list[str]) -> None:
    """Every flag turnstream's own vLLM command sets is there, and the served name is `policy`."""
    reference, env = vllm_command("/m", "0.0.0.0", 8000, VllmSection())
    flags = [a for a in reference if a.startswith("--") and a not in ("--model", "--host", "--port")]
    missing = [f for f in flags if f not in args]
    assert not missing, missing
    assert args[args.index("--served-model-name") + 1] == "policy"
    assert args[args.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert "VLLM_SERVER_DEV_MODE" in env


# ---- docker-compose ----------------------------------------------------------------------------------
def _compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())


def _compose_config() -> dict:
    return tomllib.loads((DEPLOY / "compose" / "run.toml").read_text())


def test_compose_services_and_exposure():
    services = _compose()["services"]
    assert {"vllm", "buffer", "learner", "actor", "prometheus", "grafana"} <= set(services)
    assert services["actor"]["deploy"]["replicas"] >= 1
    for name, svc in services.items():
        for port in svc.get("ports", []):  # only the monitoring UIs publish, and only on loopback
            assert name in ("prometheus", "grafana") and port.startswith("127.0.0.1:"), (name, port)
    assert "ports" not in services["vllm"]
    assert services["vllm"]["environment"]["VLLM_SERVER_DEV_MODE"] == "1"


def test_compose_commands_match_the_cli_and_config():
    services = _compose()["services"]
    cfg = validate_config(_compose_config())
    for name in ROLE_COMMANDS:
        args = parse_cli(services[name]["command"])
        assert args.command == name and args.config == "/etc/turnstream/run.toml"
        mounts = [v.split(":") for v in services[name]["volumes"]]
        assert ["./run.toml", "/etc/turnstream/run.toml", "ro"] in mounts
    exposed = {name: {int(p) for p in svc.get("expose", [])} for name, svc in services.items()}
    assert {cfg.network.buffer_ingest_port, cfg.network.buffer_serve_port, cfg.buffer.metrics_port} <= exposed["buffer"]
    assert {cfg.network.learner_pub_port, cfg.learner.metrics_port} <= exposed["learner"]
    assert cfg.actor.metrics_port in exposed["actor"]
    assert services["vllm"]["entrypoint"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    check_vllm_args(services["vllm"]["command"])
    assert cfg.vllm.urls == ["http://vllm:8000"]
    inits = [shlex.split(c) for c in re.findall(r"\|\| (turnstream [^)]*)\)", services["model-init"]["command"][0])]
    for init in inits:
        parse_cli(init[1:])
    keys_dir = _compose_config()["network"]["keys_dir"]
    assert ["turnstream", "keygen", keys_dir] in inits  # the keys the roles' network.keys_dir names
    for name in ROLE_COMMANDS:
        assert any(v.split(":")[1] == keys_dir for v in services[name]["volumes"]), f"{name} lacks the keys"


def test_compose_prometheus_scrapes_the_configured_ports():
    cfg = validate_config(_compose_config())
    prom = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for s in job.get("static_configs", []) for t in s["targets"]}
    assert {f"buffer:{cfg.buffer.metrics_port}", f"learner:{cfg.learner.metrics_port}", "vllm:8000"} <= targets
    (dns,) = [job for job in prom["scrape_configs"] if "dns_sd_configs" in job]
    assert dns["dns_sd_configs"][0]["names"] == ["actor"] and dns["dns_sd_configs"][0]["port"] == cfg.actor.metrics_port
    volumes = _compose()["services"]["prometheus"]["volumes"]
    for volume in volumes:
        assert (DEPLOY / "compose" / volume.split(":")[0]).resolve().is_file(), volume


# ---- Kubernetes ---------------------------------------------------------------------------------------
def _k8s() -> list[dict]:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    docs = []
    for rel in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / "k8s" / rel).read_text()) if d]
    return docs


def _k8s_config() -> Config:
    return validate_config(tomllib.loads((DEPLOY / "k8s" / "run.toml").read_text()))


def _workloads() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in _k8s() if d["kind"] in ("StatefulSet", "Deployment")}


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    on_disk = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk
    for generator in kustomization["configMapGenerator"]:
        for f in generator["files"]:
            assert (DEPLOY / "k8s" / f).is_file()


def test_k8s_workload_kinds_and_volumes():
    w = _workloads()
    assert w["turnstream-buffer"]["kind"] == w["turnstream-learner"]["kind"] == "StatefulSet"
    assert w["turnstream-vllm"]["kind"] == "StatefulSet"
    assert w["turnstream-actor"]["kind"] == "Deployment"
    for name in ("turnstream-buffer", "turnstream-learner"):
        claims = w[name]["spec"]["volumeClaimTemplates"]
        mounts = {m["name"]: m["mountPath"] for m in w[name]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
        assert claims and mounts[claims[0]["metadata"]["name"]] == "/data"  # run_dir lives there
    for d in w.values():
        selector = d["spec"]["selector"]["matchLabels"]
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), d["metadata"]["name"]
    pvcs = {d["metadata"]["name"]: d for d in _k8s() if d["kind"] == "PersistentVolumeClaim"}
    assert pvcs["turnstream-shared"]["spec"]["accessModes"] == ["ReadWriteMany"]


def test_k8s_roles_mount_the_curve_keys_each_needs_at_keys_dir():
    keys_dir = tomllib.loads((DEPLOY / "k8s" / "run.toml").read_text())["network"]["keys_dir"]
    assert _k8s_config().network.curve == "on"
    for name, server in (("turnstream-buffer", True), ("turnstream-learner", True), ("turnstream-actor", False)):
        pod = _workloads()[name]["spec"]["template"]["spec"]
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == keys_dir]
        assert mount["readOnly"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        paths = {item["path"] for item in volume["secret"]["items"]}
        assert {"server.key", "client.key_secret"} <= paths
        # only the roles that bind a socket hold the server's secret and the allow-list
        assert ("server.key_secret" in paths) == server == ("allowed_clients/client.key" in paths)


def test_k8s_commands_probes_and_ports_match_the_config():
    cfg = _k8s_config()
    assert cfg.run.run_dir.startswith("/data/")
    metrics = {"buffer": cfg.buffer.metrics_port, "learner": cfg.learner.metrics_port, "actor": cfg.actor.metrics_port}
    for name, d in _workloads().items():
        spec = d["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c["image"].split(":")[0] == "turnstream", c["name"]
        container = spec["containers"][0]
        role = d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        if role == "vllm":
            assert container["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
            check_vllm_args(container["args"])
            env = {e["name"]: e["value"] for e in container["env"]}
            assert env["VLLM_SERVER_DEV_MODE"] == "1"
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"]["path"] == "/health"
            (init,) = spec["initContainers"]
            assert "exec turnstream" in init["command"][2]
            parse_cli(init["args"])
            continue
        assert "command" not in container  # the image's entrypoint is `turnstream`
        args = parse_cli(container["args"])
        assert args.command == role and args.config == "/etc/turnstream/run.toml"
        assert ports["metrics"] == metrics[role]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, (name, probe)
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["config"] == "/etc/turnstream"
    hosts = [u.split("//")[1].split(":")[0] for u in cfg.vllm.urls]
    assert all(h.startswith("turnstream-vllm-") and h.endswith(".turnstream-vllm") for h in hosts)


def test_k8s_services_match_the_config_and_stay_internal():
    cfg = _k8s_config()
    docs = _k8s()
    assert not [d for d in docs if d["kind"] == "Ingress"]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for svc in services.values():
        assert svc["spec"].get("type", "ClusterIP") == "ClusterIP", svc["metadata"]["name"]
    ports = {name: {p["port"] for p in svc["spec"]["ports"]} for name, svc in services.items()}
    assert {cfg.network.buffer_ingest_port, cfg.network.buffer_serve_port, cfg.buffer.metrics_port} <= ports["turnstream-buffer"]
    assert {cfg.network.learner_pub_port, cfg.learner.metrics_port} <= ports["turnstream-learner"]
    assert services["turnstream-vllm"]["spec"]["clusterIP"] == "None"  # per-pod DNS names for vllm.urls
    network = tomllib.loads((DEPLOY / "k8s" / "run.toml").read_text())["network"]
    assert network.get("buffer_host") in services and network.get("learner_host") in services


def test_k8s_network_policy_guards_vllm_dev_routes():
    policies = {d["metadata"]["name"]: d for d in _k8s() if d["kind"] == "NetworkPolicy"}
    vllm = policies["turnstream-vllm"]["spec"]
    assert vllm["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "vllm"
    assert vllm["policyTypes"] == ["Ingress"]
    (from_roles,) = [rule["from"][0]["podSelector"] for rule in vllm["ingress"] if "podSelector" in rule["from"][0]]
    (expr,) = from_roles["matchExpressions"]
    assert set(expr["values"]) == {"learner", "actor"}
    assert "turnstream-roles" in policies


def test_kubernetes_scrape_config_finds_annotated_pods():
    for d in _workloads().values():
        ann = d["spec"]["template"]["metadata"]["annotations"]
        container = d["spec"]["template"]["spec"]["containers"][0]
        assert ann["prometheus.io/scrape"] == "true"
        assert int(ann["prometheus.io/port"]) in {p["containerPort"] for p in container["ports"]}


# ---- Slurm --------------------------------------------------------------------------------------------
SBATCH = DEPLOY / "slurm" / "turnstream.sbatch"


def test_sbatch_is_valid_bash_with_directives():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)
    text = SBATCH.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    for directive in ("--job-name", "--nodes", "--time"):
        assert f"#SBATCH {directive}=" in text


def _expand(line: str) -> str:
    """Shell variables and arithmetic replaced by 1, which every field involved accepts."""
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z_0-9]*\}?|\$\(\([^)]*\)\)", "1", line)


def test_sbatch_commands_match_the_cli():
    text = SBATCH.read_text().replace("\\\n", " ")
    commands = re.findall(r'"\$TURNSTREAM" ([^&\n]+)', text)
    seen = set()
    for command in commands:
        argv = shlex.split(_expand(command))
        seen.add(parse_cli(argv).command)
    assert ROLE_COMMANDS | {"make-tiny-model"} <= seen
    (vllm,) = re.findall(r"vllm\.entrypoints\.openai\.api_server ([^&\n]+)", text)
    check_vllm_args(shlex.split(_expand(vllm)))


def test_sbatch_run_config_loads():
    text = SBATCH.read_text()
    body = text.split("<<TOML\n", 1)[1].split("\nTOML\n", 1)[0]
    body = body.replace('[${urls%, }]', '["http://node1:8000"]')
    cfg = validate_config(tomllib.loads(_expand(body)))
    assert cfg.network.buffer_ingest_port == 5555 and cfg.learner.weights_dir


# ---- Dockerfile ---------------------------------------------------------------------------------------
def test_dockerfile_installs_every_package_and_runs_the_cli():
    text = (DEPLOY / "Dockerfile").read_text()
    for package in ("turnstream", "actors", "buffer", "learner", "protocol"):
        assert f"COPY {package} {package}" in text
    assert 'ENTRYPOINT ["turnstream"]' in text and "USER turnstream" in text


def test_deploy_files_name_no_hosts_or_absolute_machine_paths():
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            text = path.read_text()
            # neither this checkout's location nor the user's home may leak into a shipped file
            assert str(ROOT) not in text and str(Path.home()) not in text, path
            assert not re.search(r"\b(docker\.io|ghcr\.io|quay\.io|gcr\.io|nvcr\.io)\b", text), path
