"""Stop the Ray processes of one local cluster, found by its temp dir; other clusters are left alone.

Usage: python stop_cluster.py TEMP_DIR [PORT ...]

A process belongs to the cluster when its command line names TEMP_DIR (gcs_server, raylet,
dashboard, monitors), when it holds a file open under TEMP_DIR (the Ray client server and the
agents write their logs there but do not name it), or when it descends from one of those (the
dashboard's module processes, the raylet's workers). Each gets SIGTERM, then SIGKILL after a
grace period. Then the PORTs given (the cluster's GCS, dashboard, agent and client ports) are
checked free; the exit status is 1 if a process survived or a port is still taken.
"""

from __future__ import annotations

import sys

import psutil


def cluster_processes(temp_dir: str) -> list[psutil.Process]:
    me = psutil.Process().pid
    roots: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid == me:
            continue
        try:
            if any(temp_dir in arg for arg in proc.info.get("cmdline") or []) or any(
                f.path.startswith(temp_dir) for f in proc.open_files()
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


def stop(temp_dir: str, grace_seconds: float = 10.0) -> tuple[int, list[psutil.Process]]:
    """(processes signalled, survivors)."""
    procs = cluster_processes(temp_dir)
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
    _, survivors = psutil.wait_procs(alive, timeout=5)
    return len(procs), survivors


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
