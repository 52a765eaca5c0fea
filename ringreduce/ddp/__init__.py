"""Data parallelism over ringreduce: a DistributedDataParallel wrapper with bucketed,
overlapped gradient all-reduce, and torch-compatible communication hooks."""

from . import hooks
from .hooks import GradBucket
from .join import UnevenInputsError
from .wrapper import DistributedDataParallel

__all__ = ["DistributedDataParallel", "GradBucket", "UnevenInputsError", "hooks"]
