"""The checkpoint manager under SIGKILL at random moments (docs/MANAGER.md "Soak").

A small real training job (manager_soak_worker.py: MLP + AdamW, async saves
every 2 steps, keep_last=3) on 1 and on 2 gloo ranks is killed with SIGKILL
(every rank at once, as a node failure does) at a random moment after it
started training, and restarted. Every restart checks (in the worker) that
it resumed from the newest complete step, that model and optimizer state
equal byte for byte what was saved at that step, that the step counter
continues, and that the root holds at most 3 complete steps and at most one
partial; here, after every kill, that the root holds at most 3 + 1 complete
steps (a kill between a commit and its retention; the restart removes the
extra one) and at most one partial.

CI runs as many kills as fit in CKPTIO_TEST_SOAK_SECONDS (default 50 per rank
count: about two minutes in all); set it higher for a long run, e.g.
CKPTIO_TEST_SOAK_SECONDS=600. The numbers are printed (pytest -s) and recorded in
docs/MANAGER.md.
"""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import ckptio  # noqa: E402

WORKER = Path(__file__).with_name("manager_soak_worker.py")
TOTAL_STEPS = 400
SAVE_EVERY = 2


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(ckptio.__file__).parent.parent)] + sys.path)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _base_dir(tmp_path: Path) -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        import tempfile

        return Path(tempfile.mkdtemp(prefix="ckptio-soak-", dir=shm))
    return tmp_path


class _Launcher:
    """Starts each job's ranks ahead of time (imports take seconds) and lets
    them go once the previous job is gone."""

    def __init__(self, base: Path, world: int):
        self.base, self.world, self.count, self.warm = base, world, 0, None

    def _spawn(self):
        self.count += 1
        init = self.base / f"init{self.count}"
        return [subprocess.Popen([sys.executable, str(WORKER), "-", "-", str(rank), str(self.world), str(init),
                                  str(TOTAL_STEPS), str(SAVE_EVERY)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, env=_env(), text=True)
                for rank in range(self.world)]

    def start(self, root: Path, refs: Path):
        procs = self.warm or self._spawn()
        self.warm = self._spawn()
        for p in procs:
            p.stdin.write(f"GO\n{root}\n{refs}\n")
            p.stdin.flush()
        return procs

    def close(self):
        for p in self.warm or []:
            p.kill()
            _rest(p)


def _read_ready(proc, timeout=120.0) -> str:
    """The READY line of rank 0 (a SOAK-FAIL line or an exit fails the test)."""
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("SOAK-FAIL"):
            break
        if line.startswith("READY"):
            return line
    proc.kill()
    rest = proc.stdout.read() if proc.stdout else ""
    pytest.fail("the job did not start:\n" + "".join(lines) + rest)


def _rest(proc) -> str:
    """What the process prints until it ends, through the same buffered
    reader _read_ready used (communicate() would read the pipe beside it
    and miss what that reader holds already)."""
    proc.stdin.close()
    rest = proc.stdout.read()
    proc.wait()
    return rest


def _check_root(root: Path, what: str):
    states = [s[1] for s in ckptio._ckptio.steps_scan(root)] if root.exists() else []
    assert states.count("complete") <= 4, f"{what}: {states}"
    assert states.count("partial") <= 1, f"{what}: {states}"
    assert "damaged" not in states, f"{what}: {states}"
    return states


def soak(tmp_path: Path, world: int, seconds: float, rng: random.Random):
    base = _base_dir(tmp_path)
    kills = restarts = resumed_from_step = finished = 0
    run = 0
    root, refs = base / f"root{run}", base / f"refs{run}"
    refs.mkdir(parents=True)
    launcher = _Launcher(base, world)
    t_end = time.monotonic() + seconds
    try:
        while time.monotonic() < t_end:
            procs = launcher.start(root, refs)
            ready = _read_ready(procs[0])
            restarts += 1
            if ready.split()[1] != "None":
                resumed_from_step += 1
            time.sleep(rng.uniform(0.05, 2.5))
            if any(p.poll() is not None for p in procs):  # finished (or failed) before the kill
                outs = [_rest(p) for p in procs]
                codes = [p.returncode for p in procs]
                assert codes == [0] * world and "DONE" in outs[0], f"rank exit codes {codes}:\n" + "\n".join(outs)
                finished += 1
                run += 1
                root, refs = base / f"root{run}", base / f"refs{run}"
                refs.mkdir(parents=True)
                continue
            for p in procs:
                p.send_signal(signal.SIGKILL)
            outs = [_rest(p) for p in procs]
            fails = [o for o in outs if "SOAK-FAIL" in o]
            assert not fails, fails[0]
            kills += 1
            _check_root(root, f"after kill {kills}")
        # The last root resumes once more and checks itself.
        procs = launcher.start(root, refs)
        _read_ready(procs[0])
        for p in procs:
            p.kill()
            _rest(p)
    finally:
        import shutil

        launcher.close()
        if base != tmp_path:
            shutil.rmtree(base, ignore_errors=True)
    return kills, restarts, resumed_from_step, finished


@pytest.mark.parametrize("world", [1, 2])
def test_soak_sigkill(tmp_path, world):
    seconds = float(os.environ.get("CKPTIO_TEST_SOAK_SECONDS", "50"))
    rng = random.Random(int(os.environ.get("CKPTIO_TEST_SOAK_SEED", "1234")) + world)
    t0 = time.monotonic()
    kills, restarts, resumed, finished = soak(tmp_path, world, seconds, rng)
    print(f"\nsoak: {world} rank(s): {kills} SIGKILLs, {restarts} restarts ({resumed} resumed from a saved step, "
          f"{finished} runs to the end) in {time.monotonic() - t0:.0f} s")
    assert kills >= 3
    assert resumed >= 2
