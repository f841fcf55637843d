"""One string hash on every rank, so a set or dict of strings has one order on every rank (data built by iterating
one is the same everywhere): nbddp's launches set PYTHONHASHSEED=0 (recipe.py); under another launcher (plain
torchrun, accelerate) a rank without it starts again with it set, as the script starts: before anything of the
notebook ran, and before torch is imported (a script carries this module's code ahead of its other imports,
nbddp/inline.py), so starting again costs a Python start-up only. A PYTHONHASHSEED the user set is kept."""
import os
import sys


def nbddp_same_hash_seed():
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1  # a rank of a job, as its launcher started it
    if not launched or "PYTHONHASHSEED" in os.environ or not getattr(sys, "orig_argv", None):
        return
    os.environ["PYTHONHASHSEED"] = "0"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


nbddp_same_hash_seed()
