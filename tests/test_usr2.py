"""SLURM's warning (SIGUSR2, sent to every process of the job step) stops the trainer after
its step and nothing else: processes the trainer starts (vLLM's engine core, sandboxed
programs) outlive it (issue 30, item 4)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A trainer's process under `usr2_stops`: a thread (like the scorer's) starts a program,
# then the whole process group gets SIGUSR2, as SLURM's step-wide warning does.
_SCRIPT = textwrap.dedent("""
    import os, signal, subprocess, threading, time
    from gridrun.train.distributed import Dist
    from gridrun.cellrun import usr2_stops

    dist = Dist.from_env({})
    with usr2_stops(dist):
        started = []
        thread = threading.Thread(target=lambda: started.append(subprocess.Popen(["sleep", "30"])))
        thread.start(); thread.join()
        (child,) = started
        os.killpg(0, signal.SIGUSR2)
        time.sleep(0.5)
        print("child alive:", child.poll() is None)
        print("stop:", dist.should_stop())
        print("stop taken once:", signal.SIGUSR2 not in signal.sigpending())
        child.kill(); child.wait()
    print("handler restored:", signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL)
""")


def test_usr2_stops_the_trainer_and_spares_its_children() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], check=False, capture_output=True, text=True, timeout=120,
                         start_new_session=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        "child alive: True", "stop: True", "stop taken once: True", "handler restored: True"], out.stdout
