"""torch's entry point as it was named before it moved to ``_ringreduce_autoload``
(ringreduce/_toplevel/_ringreduce_autoload): an editable install made earlier still names
this one in its metadata, and a missing module would make every ``import torch`` fail.
Re-running ``pip install -e .`` updates the metadata."""

try:
    from ._toplevel._ringreduce_autoload import register  # (a namespace package)
except ImportError:  # a wheel: the top-level copy only
    from _ringreduce_autoload import register  # noqa: F401
