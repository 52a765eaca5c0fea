"""What every rank of a job publishes at init and compares: its job-wide settings
(_env.job_wide), a check of the job secret and the launcher's job id, as one table
"VAR=value;..." per rank, which every rank reads alike (so every rank raises the same
error). Used by _rendezvous; the job id also tells this job from another on its port.
"""

from __future__ import annotations

import hashlib

from . import _env

# The job id's entry (a mismatch names it by this).
RUN_ID_KEY = f"job id ({_env.RUN_ID_VARS})"


def secret_check(secret: str) -> str:
    """What ranks compare of the job secret at init: 32 bits of a hash, enough to tell
    two secrets apart, not to recover one."""
    return "sha256:" + hashlib.sha256(b"ringreduce-secret/" + secret.encode()).hexdigest()[:8]


def published(settings: str, secret: str) -> str:
    """This rank's table: `settings`, the secret's check and the job id."""
    return f"{settings};RINGREDUCE_SECRET={secret_check(secret)};{RUN_ID_KEY}={_env.run_id()}"


def run_id_of(published_table: str) -> str:
    """The job id in a rank's published table ("" if it gave none)."""
    return table(published_table).get(RUN_ID_KEY, "")


def check_same(per_rank: list, rank: int) -> None:
    """ValueError naming the first job-wide knob whose value differs between ranks."""
    tables = [table(s) for s in per_rank]
    for var in tables[rank]:
        values = [t.get(var, "?") for t in tables]
        if len(set(values)) > 1:
            shown = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values[:8]))
            more = f" (and {len(values) - 8} more ranks)" if len(values) > 8 else ""
            raise ValueError(
                f"{var} differs between ranks ({shown}{more}); it must be the same on every "
                f"rank of a job: set it (or leave it unset) alike for all of them")


def table(settings: str) -> dict[str, str]:
    """A rank's published settings as a dict."""
    return dict(kv.split("=", 1) for kv in settings.split(";") if "=" in kv)
