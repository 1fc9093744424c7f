"""A real Slurm cluster on one machine, for tests that submit jobs as a user would: on top of tests/cluster.py,
a controller host runs `slurmctld` (and is the login host the test's `sbatch`, `squeue`, `scancel` run on),
and each node host runs a `slurmd` of its own, so a job's steps run inside the nodes' network namespaces and
reach each other over the bridge at the addresses Slurm knows the nodes by (NodeAddr, 10.77.0.x).

    with SlurmCluster(tmp_path, nodes=2) as slurm:
        job = slurm.sbatch(["--nodes=2", "job.sbatch"], env={"RUN_DIR": ...}, cwd=checkout)
        slurm.node_address("node0")          # 10.77.0.2
        slurm.processes("node1")             # PIDs of what runs on node1 (its slurmd excepted)
        slurm.run(["scancel", str(job)])

Everything lives under the test's directory: munged runs with its own key, socket, pid, log and seed files
(slurm.conf's AuthInfo points at that socket; a path-based unix socket is the same file in every network
namespace, so one munged serves every host), and slurm.conf, cgroup.conf, the controller's state, each
node's spool directory and pid file, and every daemon's log (logs/) are written there too. The machine's own
/etc/munge, /etc/slurm and services are never used. The cluster runs as root (SlurmUser=root) without
cgroups: processes are tracked by their parent chain (proctrack/linuxproc) and tasks are not bound to CPUs
(task/none). Two things differ from a cluster of machines because the hosts share one: every namespace has
the machine's hostname, so SlurmctldHost names it (slurmctld runs only where it is named) and each slurmd is
told its node name (`slurmd -N`); and `ip netns exec` mounts a /sys of the namespace's own, without the
cgroup filesystem, which slurmd 22.05 initialises even when nothing uses it: cgroup.conf points it at an
empty folder.

On exit, also when the test fails, every job is cancelled, the daemons are stopped by PID, whatever is left in
a node's namespace (a step that outlived its slurmd) is killed by PID, and the namespaces are removed.
`slurm_unavailable()` says why no such cluster can be made here, for the tests to skip with; scripts/setup.sh
installs Debian's slurm-wlm and munge where it can.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.cluster import Cluster, cluster_unavailable
from tests.helpers import wait_for_child
from turnstream.launch.processes import ProcessGroup

CONTROLLER = "controller"
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")
CLIENTS = ("sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo")


def slurm_unavailable() -> str | None:
    """Why no Slurm cluster can be made on this machine, or None when one can."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name) is None]
    if missing:
        return f"no Slurm/MUNGE binaries ({', '.join(missing)}): scripts/setup.sh installs slurm-wlm and munge"
    return cluster_unavailable()


class SlurmCluster:
    def __init__(self, tmp_path: Path, nodes: int):
        self.dir = tmp_path / "slurm"
        self.node_names = [f"node{i}" for i in range(nodes)]
        # each node's CPUs: what slurmd finds (no more, or it drains the node: "Low CPUs")
        self.cpus = len(os.sched_getaffinity(0))
        self.cluster = Cluster([CONTROLLER, *self.node_names])
        self.conf = self.dir / "slurm.conf"
        self.procs = ProcessGroup(self.dir)

    # ---- life cycle -------------------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        self.cluster.__enter__()
        try:
            self._start_munge()
            self._write_conf()
            self._start_daemons()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            self._cancel_every_job()
            self.procs.stop_all(timeout_s=10)
            for node in self.node_names:  # a step whose slurmd is gone is reparented, never stopped by it
                for pid in self.processes(node):
                    _kill(pid)
        finally:
            self.cluster.__exit__()

    def _start_munge(self) -> None:
        munge = self.dir / "munge"
        munge.mkdir(parents=True)
        munge.chmod(0o755)  # munged wants its socket's folder searchable by every user
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.munge_socket = munge / "munge.socket"
        # --force: the test's folders sit under pytest's 0700 base folder, which munged would refuse as an
        # inaccessible socket path; everything here runs as root, which reaches it.
        munged = self.procs.start("munged", [
            "munged", "--foreground", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
            f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}"])
        wait_for_child(self.munge_socket.is_socket, "munged's socket", munged, 30)

    def _write_conf(self) -> None:
        d = self.dir
        (d / "state").mkdir()
        for name in self.node_names:
            (d / "spool" / name).mkdir(parents=True)
        (d / "cgroup").mkdir()
        (d / "cgroup.conf").write_text(f"CgroupPlugin=cgroup/v1\nCgroupMountpoint={d / 'cgroup'}\n")
        ctl = self.cluster[CONTROLLER]
        nodes = "\n".join(f"NodeName={name} NodeAddr={self.cluster[name].address} CPUs={self.cpus} State=UNKNOWN"
                          for name in self.node_names)
        self.conf.write_text(f"""\
ClusterName=turnstream-test
SlurmctldHost={socket.gethostname()}({ctl.address})
MailProg=/bin/true
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d / 'state'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdSpoolDir={d / 'spool' / '%n'}
SlurmdPidFile={d / 'slurmd-%n.pid'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdTimeout=60
# Slurm's default: a cancelled job's steps get SIGTERM, and SIGKILL this long after
KillWait=30
{nodes}
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _start_daemons(self) -> None:
        ctl = self.procs.start("slurmctld", self.cluster[CONTROLLER].command(
            ["slurmctld", "-D", "-f", str(self.conf)]))
        for name in self.node_names:
            self.procs.start(f"slurmd-{name}", self.cluster[name].command(
                ["slurmd", "-D", "-N", name, "-f", str(self.conf)]))
        wait_for_child(lambda: self._idle_nodes() == set(self.node_names), "every node idle in sinfo", ctl, 60)

    def _idle_nodes(self) -> set[str]:
        done = self.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], check=False)
        return {line.split()[0] for line in done.stdout.splitlines() if line.split()[1:] == ["idle"]}

    def _cancel_every_job(self) -> None:
        """What a failed test left queued or running, cancelled while the controller can still do it."""
        controller = [c for c in self.procs.children if c.name == "slurmctld" and c.proc.poll() is None]
        if not controller:
            return
        try:
            if jobs := self.jobs():
                self.run(["scancel", *map(str, jobs)])
                deadline = time.monotonic() + 60  # past KillWait: by then every step is SIGKILLed
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.5)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pass  # what is left in the nodes' namespaces is killed by PID next

    # ---- what a test uses ---------------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """The environment of a Slurm client command (and, through sbatch, of the job)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, argv: list[str], env: dict[str, str] | None = None, check: bool = True,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        """A Slurm client command on the login host (the controller's), e.g. ["squeue"]."""
        return subprocess.run(self.cluster[CONTROLLER].command(argv), env={**self.env, **(env or {})}, cwd=cwd,
                              capture_output=True, text=True, timeout=60, check=check)

    def sbatch(self, args: list[str], env: dict[str, str], cwd: Path) -> int:
        """Submit a batch job from `cwd` with `env` added to the submitter's environment; its job id."""
        done = self.run(["sbatch", "--parsable", *args], env=env, cwd=cwd)
        return int(done.stdout.strip().split(";")[0])

    def jobs(self) -> list[int]:
        """Ids of the jobs the controller still lists (pending, running or completing)."""
        return [int(line) for line in self.run(["squeue", "--noheader", "--format=%i"]).stdout.split()]

    def node_address(self, name: str) -> str:
        return self.cluster[name].address

    def processes(self, node: str) -> set[int]:
        """PIDs of every process in the node's network namespace but its slurmd: what the jobs run there."""
        daemon = {c.proc.pid for c in self.procs.children if c.name == f"slurmd-{node}"}
        listed = subprocess.run(["ip", "netns", "pids", self.cluster[node].namespace], capture_output=True,
                                text=True).stdout.split()
        return {int(pid) for pid in listed} - daemon


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
