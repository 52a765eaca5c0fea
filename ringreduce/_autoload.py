"""torch's entry point as it was named before it moved to ``_ringreduce_autoload``
(ringreduce/_torch_hook): an editable install made earlier still names this one in its
metadata, and a missing module would make every ``import torch`` fail. Re-running
``pip install -e .`` updates the metadata."""

from ._torch_hook import register  # noqa: F401
