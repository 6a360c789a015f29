"""Stop the Ray processes of one local cluster, found by its temp dir; other clusters are left alone.

Usage: python stop_cluster.py TEMP_DIR [PORT ...]

A process belongs to the cluster when its command line names TEMP_DIR (gcs_server, raylet,
dashboard, monitors), when it is one of Ray's own processes holding a file open under TEMP_DIR
(the Ray client server and the agents write their logs there but do not name it; a driver that
joined the cluster logs there too, and is left alone), or when it descends from one of those
(the dashboard's module processes, the raylet's workers). Each gets SIGTERM, then SIGKILL after a
grace period; the GCS goes last. Then the PORTs given (the cluster's GCS, dashboard, agent and
client ports) are checked free; the exit status is 1 if a process survived or a port is still taken.
"""

from __future__ import annotations

import os
import re
import sys

import psutil


def cluster_processes(temp_dir: str) -> list[psutil.Process]:
    me = psutil.Process().pid
    root = os.path.abspath(temp_dir).rstrip(os.sep)

    def under(path: str) -> bool:  # /tmp/x/tmp2 is not under /tmp/x/tmp
        return path == root or path.startswith(root + os.sep)

    names = re.compile(re.escape(root) + r"(?=$|/|[\s'\",;:])").search  # the dir named inside an argument

    roots: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        if proc.pid == me:
            continue
        try:
            cmdline = proc.info.get("cmdline") or []
            if any(names(arg) for arg in cmdline) or (
                _is_ray_process(proc.info.get("name") or "", cmdline) and any(under(f.path) for f in proc.open_files())
            ):
                roots[proc.pid] = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    found = dict(roots)
    for proc in list(roots.values()):
        try:
            found.update({child.pid: child for child in proc.children(recursive=True)})
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    found.pop(me, None)
    return list(found.values())


def _is_ray_process(name: str, cmdline: list[str]) -> bool:
    """Ray's own processes: workers (``ray::...``), its binaries and its Python modules."""
    if name.startswith("ray::") or name in ("raylet", "gcs_server"):
        return True
    return any("/ray/" in arg or arg.startswith("ray.") for arg in cmdline[:3])


def stop(temp_dir: str, grace_seconds: float = 10.0) -> tuple[int, list[psutil.Process]]:
    """(processes signalled, survivors). The GCS is stopped last: signalled together, raylet's
    orderly shutdown (it unregisters its node with the GCS) and the GCS's own waited for each
    other until the grace period ran out (12 s a stop, measured); in turn, 4 s."""
    procs = cluster_processes(temp_dir)
    gcs = [p for p in procs if _name(p) == "gcs_server"]
    survivors = _stop_all([p for p in procs if p not in gcs], grace_seconds)
    return len(procs), survivors + _stop_all(gcs, grace_seconds)


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def _stop_all(procs: list[psutil.Process], grace_seconds: float) -> list[psutil.Process]:
    """SIGTERM, SIGKILL to what is left after ``grace_seconds``: the survivors."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_seconds)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return psutil.wait_procs(alive, timeout=5)[1]


def port_taken(port: int) -> bool:
    """Something still listens on ``port`` (connections in TIME_WAIT do not count)."""
    return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in psutil.net_connections(kind="tcp"))


if __name__ == "__main__":
    temp_dir, ports = sys.argv[1], [int(p) for p in sys.argv[2:] if p]
    count, survivors = stop(temp_dir)
    taken = [p for p in ports if port_taken(p)]
    print(f"stopped {count} process(es) of the cluster in {temp_dir}"
          + (f"; still alive: {[p.pid for p in survivors]}" if survivors else "")
          + (f"; ports still taken: {taken}" if taken else "; its ports are free"))
    sys.exit(1 if survivors or taken else 0)
