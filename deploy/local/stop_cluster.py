"""Stop the Ray processes of one cluster, found by its temp dir; other clusters are left alone.

Usage: python stop_cluster.py TEMP_DIR. SIGTERM by pid, then SIGKILL after a grace period.
Workers die with their raylet.
"""

from __future__ import annotations

import sys

import psutil


def cluster_processes(temp_dir: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any(temp_dir in arg for arg in cmdline) and proc.pid != psutil.Process().pid:
            found.append(proc)
    return found


def stop(temp_dir: str, grace_seconds: float = 10.0) -> int:
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
    return len(procs)


if __name__ == "__main__":
    print(f"stopped {stop(sys.argv[1])} process(es) of the cluster in {sys.argv[1]}")
