"""Run by tests/test_launcher.py (one process, a world of 1): a forked child that makes a
world of its own stops answering with its parent's -- after its own destroy() it has none
(is_initialized() said True: the inherited copy answered again), and its own forked child
is told the world belongs to its parent, not to the grandparent."""

import os

import numpy as np

import ringreduce as rr

os.environ.update(RANK="0", WORLD_SIZE="1")
rr.init()
top = os.getpid()
pid = os.fork()
if pid == 0:
    code = 0
    try:
        assert rr.is_initialized() and rr.get_world_size() == 1  # the parent's numbers
        rr.init()  # a world of its own
        x = np.ones(3)
        rr.allreduce(x)  # runs: its own
        child = os.getpid()
        grand = os.fork()
        if grand == 0:
            try:
                rr.allreduce(x)
                os._exit(3)
            except RuntimeError as e:  # the world its parent made, named by its parent's pid
                os._exit(0 if f"process {child}," in str(e) and str(top) not in str(e) else 4)
        assert os.waitpid(grand, 0)[1] == 0, "the grandchild was not told of its parent's world"
        rr.destroy()
        assert not rr.is_initialized(), "after its own destroy() the parent's world answered"
    except AssertionError as e:
        print(f"child: {e}", flush=True)
        code = 5
    os._exit(code)
assert os.waitpid(pid, 0)[1] == 0
rr.destroy()
print("fork own world ok", flush=True)
