"""Print the local cluster's jobs as a table: id, status, entrypoint, start, duration.

Usage: python job_table.py DASHBOARD_URL   (deploy/local/status.sh runs it)
"""

from __future__ import annotations

import sys
import time


def rows(jobs) -> list[tuple[str, ...]]:
    out = []
    for job in sorted(jobs, key=lambda j: j.start_time or 0):
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(job.start_time / 1000)) if job.start_time else "-"
        end = job.end_time or (time.time() * 1000 if job.start_time else None)
        duration = f"{(end - job.start_time) / 1000:.0f}s" if job.start_time and end else "-"
        entry = job.entrypoint if len(job.entrypoint) <= 60 else job.entrypoint[:57] + "..."
        out.append((job.submission_id or job.job_id or "-", str(job.status).split(".")[-1], entry, start, duration))
    return out


def table(header: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *body])


if __name__ == "__main__":
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(sys.argv[1]).list_jobs()
    print(table(("id", "status", "entrypoint", "start", "duration"), rows(jobs)) if jobs else "no jobs")
