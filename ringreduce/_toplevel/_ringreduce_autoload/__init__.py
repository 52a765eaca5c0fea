"""torch's backend auto-loading hook: makes "ringreduce" a torch.distributed backend in
every process that imports torch, including those that never import ringreduce (a Ray Train
worker, an elastic agent's child, a script run by torchrun).

torch calls :func:`register` from ``import torch`` for each ``torch.backends`` entry point
(pyproject.toml declares ours), near the end of its own import; an exception there would
break ``import torch`` itself, so nothing escapes: a failure becomes one warning and
``init_process_group("ringreduce")`` then says the backend is unknown until
``import ringreduce`` (which registers it too). torch's switch
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns all such hooks off.

Installed as a top-level package of its own, ``_ringreduce_autoload`` (setup.py maps it
here), so that loading the entry point never imports ``ringreduce`` itself: that import
happens inside register()'s try. As ``ringreduce._autoload`` it did, outside any try -- a
failure there (a source tree without its compiled ``_C`` shadowing the installed package
from the current directory, or numpy missing) broke ``import torch`` (found by a helper).
"""

from __future__ import annotations


def register() -> None:
    """Register the "ringreduce" backend with torch.distributed (never raises)."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        from ringreduce import backend

        backend.register()
    except Exception as e:  # noqa: BLE001 - must not break `import torch`
        import warnings

        warnings.warn(f"ringreduce: could not register the torch.distributed backend at "
                      f"torch import ({type(e).__name__}: {e}); `import ringreduce` before "
                      f"init_process_group('ringreduce') to see the full error",
                      RuntimeWarning, stacklevel=2)
