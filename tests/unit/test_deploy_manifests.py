"""deploy/compose, deploy/k8s, deploy/slurm and the Dockerfile: they parse, hold the required fields, run
commands the CLI accepts (the learner's through torchrun, whose own parser reads its rendezvous settings)
and vLLM commands that match turnstream/launch/vllm_server.py, with run configurations that load, and never expose
vLLM's development routes."""
from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest
import yaml
from torch.distributed.run import get_args_parser as torchrun_parser

from turnstream.checks.preflight import preflight
from turnstream.cli import build_parser, main
from turnstream.core.config import Config, VllmSection
from turnstream.core.configtools import from_dict
from turnstream.keygen import main as keygen_main
from turnstream.launch.vllm_server import vllm_command

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


def parse_torchrun(argv: list[str]):
    """torchrun's own parse of a launch line, and the CLI's parse of the learner command it starts."""
    try:
        run = torchrun_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"torchrun rejects: {' '.join(argv)}")
    assert run.module and run.training_script == "turnstream.cli", argv
    return run, parse_cli(run.training_script_args)


def check_rendezvous(run, head: str) -> None:
    """c10d on the head node, with no restarts of its own (the supervisor restarts the whole node)."""
    assert run.rdzv_backend == "c10d" and run.rdzv_endpoint.rsplit(":", 1)[0] == head
    assert int(run.rdzv_endpoint.rsplit(":", 1)[1]) > 0 and run.rdzv_id and run.max_restarts == 0
    assert not run.standalone


def check_vllm_args(args: list[str], env: dict[str, str]) -> None:
    """Every flag turnstream's own vLLM command sets is there, the served name is `policy`, and the environment
    turns on the development routes and, with the in-process executor, lets vLLM keep it."""
    reference, reference_env = vllm_command("/m", "0.0.0.0", 8000, VllmSection())
    flags = [a for a in reference if a.startswith("--") and a not in ("--model", "--host", "--port")]
    missing = [f for f in flags if f not in args]
    assert not missing, missing
    assert args[args.index("--served-model-name") + 1] == "policy"
    assert args[args.index("--logprobs-mode") + 1] == "processed_logprobs"
    for name in ("VLLM_SERVER_DEV_MODE", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        assert env.get(name) == reference_env.get(name), name


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
    check_vllm_args(services["vllm"]["command"], services["vllm"]["environment"])
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
        for f in generator.get("files", []):
            assert (DEPLOY / "k8s" / f).is_file()


def test_k8s_workload_kinds_and_volumes():
    w = _workloads()
    assert w["turnstream-buffer"]["kind"] == w["turnstream-learner"]["kind"] == "StatefulSet"
    assert w["turnstream-vllm"]["kind"] == "StatefulSet"
    assert w["turnstream-actor"]["kind"] == "Deployment"
    claims = w["turnstream-buffer"]["spec"]["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in w["turnstream-buffer"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert claims and mounts[claims[0]["metadata"]["name"]] == "/data"  # run_dir lives there
    # every learner node sees the same run_dir (checkpoints every rank resumes from): one shared folder
    learner_data = []
    for name in ("turnstream-learner", "turnstream-learner-workers"):
        assert w[name]["kind"] == "StatefulSet"
        (data,) = [m for m in w[name]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
                   if m["mountPath"] == "/data"]
        learner_data.append((data["name"], data.get("subPath")))
    assert learner_data[0] == learner_data[1] == ("shared", "learner")
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
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        if role == "vllm":
            assert container["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
            check_vllm_args(container["args"], {e["name"]: e["value"] for e in container["env"]})
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                assert container[probe]["httpGet"]["path"] == "/health"
            (init,) = spec["initContainers"]
            assert "exec turnstream" in init["command"][2]
            parse_cli(init["args"])
            continue
        if role == "learner":  # torchrun on every learner node (test_k8s_learner_rendezvous)
            assert container["command"] == ["torchrun"]
            _, args = parse_torchrun(container["args"])
        else:
            assert "command" not in container  # the image's entrypoint is `turnstream`
            args = parse_cli(container["args"])
        assert args.command == role and args.config == "/etc/turnstream/run.toml"
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["config"] == "/etc/turnstream"
        if name == "turnstream-learner-workers":  # ranks beyond 0 serve no /metrics, so no HTTP probes
            assert not {"startupProbe", "livenessProbe", "readinessProbe"} & set(container) and "metrics" not in ports
            continue
        assert ports["metrics"] == metrics[role]
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, (name, probe)
    hosts = [u.split("//")[1].split(":")[0] for u in cfg.vllm.urls]
    assert all(h.startswith("turnstream-vllm-") and h.endswith(".turnstream-vllm") for h in hosts)


def test_k8s_learner_rendezvous():
    """Both learner StatefulSets start the same torchrun: c10d on the head pod (pod 0 of turnstream-learner,
    through the headless Service), NNODES and NPROC_PER_NODE from one ConfigMap that matches the replicas,
    and --local-addr names under which the head pod sorts first (c10d gives global rank 0 to the node whose
    address sorts first; tests/unit/test_launch_slurm_supervise.py shows it with two real torchrun agents)."""
    w = _workloads()
    head, workers = w["turnstream-learner"], w["turnstream-learner-workers"]
    services = {d["metadata"]["name"]: d for d in _k8s() if d["kind"] == "Service"}
    ranks = services["turnstream-learner-ranks"]["spec"]
    assert ranks["clusterIP"] == "None" and ranks["publishNotReadyAddresses"] is True
    assert head["spec"]["serviceName"] == workers["spec"]["serviceName"] == "turnstream-learner-ranks"
    assert head["spec"]["replicas"] == 1
    for d in (head, workers):
        assert ranks["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    # the learner Service (buffer's learner_host, the PUB socket) reaches the head pod only
    selector = services["turnstream-learner"]["spec"]["selector"]
    assert selector.items() <= head["spec"]["template"]["metadata"]["labels"].items()
    assert not selector.items() <= workers["spec"]["template"]["metadata"]["labels"].items()

    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    (shape,) = [g for g in kustomization["configMapGenerator"] if g["name"] == "turnstream-learner-ranks"]
    env = dict(literal.split("=", 1) for literal in shape["literals"])
    assert int(env["NNODES"]) == 1 + workers["spec"]["replicas"] and int(env["NPROC_PER_NODE"]) >= 1
    addrs, hosts = [], []
    for d in (head, workers):
        container = d["spec"]["template"]["spec"]["containers"][0]
        assert {"configMapRef": {"name": "turnstream-learner-ranks"}} in container["envFrom"]
        (pod_name,) = [e for e in container["env"] if e["name"] == "POD_NAME"]
        assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        run, _ = parse_torchrun(container["args"])
        check_rendezvous(run, head="turnstream-learner-0.turnstream-learner-ranks")
        assert (run.nnodes, run.nproc_per_node) == ("$(NNODES)", "$(NPROC_PER_NODE)")
        assert int(run.rdzv_endpoint.rsplit(":", 1)[1]) == ranks["ports"][0]["port"]
        assert run.local_addr == "$(POD_NAME).turnstream-learner-ranks"
        addrs.append(run.local_addr.replace("$(POD_NAME)", f"{d['metadata']['name']}-0"))
        hosts.append(run.rdzv_conf)
    assert hosts == ["is_host=1", "is_host=0"]  # the store lives on the head pod only
    assert sorted(addrs)[0] == addrs[0] == "turnstream-learner-0.turnstream-learner-ranks"
    assert _k8s_config().learner.parallel == "fsdp2"


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
        if d["metadata"]["name"] == "turnstream-learner-workers":  # ranks beyond 0 serve no /metrics
            assert "prometheus.io/scrape" not in d["spec"]["template"]["metadata"].get("annotations", {})
            continue
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
    """Shell variables (array elements too) and arithmetic replaced by 1, which every field involved accepts."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z_0-9]*\[[^]]*\]\}|\$\{?[A-Za-z_][A-Za-z_0-9]*\}?|\$\(\([^)]*\)\)", "1", line)


def test_sbatch_commands_match_the_cli():
    text = SBATCH.read_text().replace("\\\n", " ")
    commands = re.findall(r'"\$TURNSTREAM" ([^&\n]+)', text)
    seen = set()
    for command in commands:
        argv = shlex.split(_expand(command))
        seen.add(parse_cli(argv).command)
    (learner,) = re.findall(r'"\$PYTHON" -m torch\.distributed\.run ([^&\n]+)', text)
    seen.add(parse_torchrun(shlex.split(_expand(learner)))[1].command)
    # the servers start as the local launcher starts them (test_the_vllm_command_is_the_launcher_s)
    assert ROLE_COMMANDS | {"make-tiny-model", "vllm"} <= seen
    assert "vllm.entrypoints" not in text


def test_the_vllm_command_is_the_launcher_s(tmp_path, monkeypatch):
    """`turnstream vllm`, which the Slurm template starts on each worker node, execs turnstream/launch/vllm_server.py's
    command with its environment, on network.bind_host and the given port."""
    config = tmp_path / "run.toml"
    config.write_text(f'[model]\npath = "{tmp_path}"\n'
                      f'[network]\nbind_host = "0.0.0.0"\ncurve = "on"\nkeys_dir = "{_generated_keys()}"\n')
    execs = []

    def execve(path, argv, env):  # never returns, as the real one
        execs.append((path, argv, env))
        raise SystemExit(0)

    monkeypatch.setattr("os.execve", execve)
    with pytest.raises(SystemExit):
        main(["vllm", "--config", str(config), "--port", "8123"])
    ((path, argv, env),) = execs
    expected, expected_env = vllm_command(str(tmp_path), "0.0.0.0", 8123, VllmSection())
    assert path == argv[0] and argv == expected
    assert expected_env.items() <= env.items()
    check_vllm_args(argv, env)


# Slurm's NodeAddr of each stand-in node: roles reach each other at these, while steps name the nodes
NODE_ADDRESSES = {f"node{i}": f"10.0.0.{i}" for i in range(1, 13)}


def _run_sbatch(tmp_path: Path, nodes: list[str], **env) -> tuple[list[list[str]], dict]:
    """The template run by bash with stand-ins for Slurm's scontrol and srun (srun records each step's
    argv and exits) and curl: the steps it would start, and the run configuration it writes. The template
    starts its steps in the background, so each stand-in writes a file of its own: lines appended to one
    file by two at once once came out interleaved."""
    bin_dir, steps, run_dir = tmp_path / "bin", tmp_path / "steps", tmp_path / "run"
    bin_dir.mkdir()
    steps.mkdir()
    # `scontrol show hostnames` lists the nodes, `scontrol show node NAME` gives NODE_ADDRESSES[NAME]
    show_node = " ".join(f"{name}) echo 'NodeName={name} NodeAddr={NODE_ADDRESSES[name]} State=IDLE';;"
                         for name in nodes)
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\ncase "$2 $3" in "hostnames "*) printf "%s\\n" {" ".join(nodes)};;\n'
                                      f'"node "*) case "$3" in {show_node} esac;; esac\n')
    (bin_dir / "srun").write_text(f'#!/usr/bin/env bash\nprintf "%q " "$@" > "{steps}/$$"\n')
    (bin_dir / "curl").write_text("#!/bin/sh\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (run_dir / "model").mkdir(parents=True)
    (run_dir / "model" / "config.json").write_text("{}")
    (run_dir / "keys").mkdir()
    (run_dir / "keys" / "server.key").write_text("")
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "stand-in",
               "SLURMD_NODENAME": nodes[0], "SLURM_SUBMIT_DIR": str(ROOT), "RUN_DIR": str(run_dir), "SUPERVISE": "",
               "TURNSTREAM": "false",
               **env}
    proc = subprocess.run(["bash", str(SBATCH)], env=environ, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # subprocess.run returns once every stand-in closed the output pipes it inherited: all have written
    run = tomllib.loads((run_dir / "run.toml").read_text())
    return [shlex.split(step.read_text()) for step in steps.iterdir()], run


def test_sbatch_learner_torchrun_rendezvous_on_the_head_node(tmp_path):
    """LEARNER_NODES torchrun agents, one per learner node, each starting NPROC_PER_NODE processes, meet in
    a c10d rendezvous on the head node, the learner node whose address sorts first (where c10d puts global
    rank 0; tests/unit/test_launch_slurm_supervise.py), which is also where the buffer runs and where the
    configuration sends the buffer and the actors. Slurm lists node9 before node10; the sort of their
    addresses (10.0.0.9, 10.0.0.10) does not. Steps name the nodes, the configuration their addresses."""
    steps, run = _run_sbatch(tmp_path, ["node9", "node10", "node11", "node12"], LEARNER_NODES="2",
                             NPROC_PER_NODE="4")
    by_name = {}
    for argv in steps:
        name = next(a.split("=", 1)[1] for a in argv if a.startswith("--job-name="))
        node = next(a.split("=", 1)[1] for a in argv if a.startswith("--nodelist="))
        by_name[name] = (node, argv[argv.index(next(a for a in argv if a.startswith("--job-name="))) + 1:])
    learners = {name: v for name, v in by_name.items() if name.startswith("learner-")}
    assert sorted(learners) == ["learner-node10", "learner-node9"]
    for name, (node, argv) in learners.items():
        assert name == f"learner-{node}" and argv[1:3] == ["-m", "torch.distributed.run"]
        torchrun, learner = parse_torchrun(argv[3:])
        check_rendezvous(torchrun, head=NODE_ADDRESSES["node10"])
        assert (torchrun.nnodes, torchrun.nproc_per_node, torchrun.local_addr) == ("2", "4", NODE_ADDRESSES[node])
        assert torchrun.rdzv_conf == f"is_host={int(node == 'node10')}"  # the store lives on the head only
        assert learner.command == "learner"
    assert by_name["buffer"][0] == "node10"
    assert {node for name, (node, _) in by_name.items() if name.startswith("vllm-")} == {"node11", "node12"}
    assert run["network"]["buffer_host"] == run["network"]["learner_host"] == NODE_ADDRESSES["node10"]
    assert run["vllm"]["urls"] == ["http://10.0.0.11:8000", "http://10.0.0.12:8000"]
    assert run["learner"]["parallel"] == "fsdp2"
    # a restarted learner comes back at most buffer.eta versions behind (turnstream/launch/stack.py)
    assert run["learner"]["checkpoint_every"] == run["buffer"]["eta"]
    targets = json.loads((tmp_path / "run" / "prometheus-targets.json").read_text())
    # every actor of the job (ACTORS_PER_NODE=2 on each worker) has an index of its own, and with it a metrics
    # port, as actor.num_processes counts them
    actors = sorted((parse_cli(argv[1:]).index, node) for name, (node, argv) in by_name.items()
                    if name.startswith("actor-"))
    assert actors == [(0, "node11"), (1, "node11"), (2, "node12"), (3, "node12")]
    assert run["actor"]["num_processes"] == 4
    actor_targets = ["10.0.0.11:9103", "10.0.0.11:9104", "10.0.0.12:9105", "10.0.0.12:9106"]
    assert [t["targets"] for t in targets] == [["10.0.0.10:9101"], ["10.0.0.10:9102"], actor_targets]


def test_sbatch_needs_a_node_beyond_the_learners(tmp_path):
    with pytest.raises(AssertionError, match="need more than LEARNER_NODES=2 nodes"):
        _run_sbatch(tmp_path, ["node1", "node2"], LEARNER_NODES="2")


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
