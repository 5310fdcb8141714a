"""Every byte read once per node: ckptio.load / get_slices with a process group.

2 and 3 processes on gloo (a file:// store) run a list of scenarios in one
process group: replicas (every rank the whole model), tensor-parallel rows,
columns and a pattern rule, per-rank mixes of slices (different on each
rank, with steps, ints and overlaps), several batches; then failures on one
rank (a missing shard in its view, a read failing in its direct reads or in
an owner's read ahead, a bad request, a different model), after each of which
the same group goes on loading. Every result is compared byte for byte with
what ``safetensors`` itself gives (``safe_open(...).get_slice(name)[index]``);
the per-rank ``ckptio.last_load_stats()`` must show storage read once overall.
The plan (who reads what) is also tested in-process.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

import ckptio  # noqa: E402
from ckptio import _distributed  # noqa: E402

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ckptio.__file__)))
pytestmark = pytest.mark.filterwarnings("ignore")


def make_tensors(seed=3):
    g = torch.Generator().manual_seed(seed)

    def rnd(shape, dtype):
        n = 1
        for s in shape:
            n *= s
        size = torch.empty((), dtype=dtype).element_size()
        raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
        if dtype == torch.bool:
            raw = raw % 2
        return raw.view(dtype).reshape(shape)

    t = {}
    for i in range(2):
        t[f"layers.{i}.q.weight"] = rnd((48, 40), torch.bfloat16)
        t[f"layers.{i}.o.weight"] = rnd((40, 48), torch.float32)
        t[f"layers.{i}.norm"] = rnd((40,), torch.float32)
    t["embed.weight"] = rnd((101, 40), torch.float16)  # 101 rows: uneven over 2 and 3 ranks
    t["step"] = rnd((), torch.int64)
    t["empty"] = torch.zeros((0, 4))
    t["mask"] = rnd((33, 7), torch.bool)
    t["conv"] = rnd((6, 5, 4), torch.int8)
    t["f8"] = rnd((16, 12), torch.float8_e4m3fn)
    return t


def write_model(path, tensors, shards=3):
    """A Hugging Face directory written by safetensors (data not 4 KiB aligned) and its index."""
    os.makedirs(path, exist_ok=True)
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[s::shards]}
        save_file(part, os.path.join(path, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return weight_map


def same_bytes(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    fa, fb = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    return torch.equal(fa.view(torch.uint8), fb.view(torch.uint8))


def model_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors.values())


WORKER = textwrap.dedent(
    """
    import datetime, json, os, sys, threading, traceback, warnings
    warnings.simplefilter("ignore")
    import torch, torch.distributed as dist
    from safetensors import safe_open
    import ckptio
    from ckptio import _distributed, _errors, _group_read

    rank, world, store, cfg = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    pg = dist.group.WORLD
    MODEL, OTHER, BROKEN = cfg["model"], cfg["other"], cfg["broken"]

    with open(os.path.join(MODEL, "model.safetensors.index.json")) as fh:
        SHARD = json.load(fh)["weight_map"]

    def ref(name, index=...):
        # safetensors' own reading (independent of ckptio), indexed by torch.
        with safe_open(os.path.join(MODEL, SHARD[name]), framework="pt") as f:
            full = f.get_tensor(name)
        return full if index is ... else full[index]

    def same(a, b):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        fa, fb = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
        return torch.equal(fa.view(torch.uint8), fb.view(torch.uint8)) if fa.numel() else True

    def tp_part(name, dim):
        full = ref(name)
        if dim is None:
            return full
        return torch.tensor_split(full, world, dim % full.dim())[rank]

    def check_tp(sd, rule):
        bad = [n for n in SHARD if not same(sd[n], tp_part(n, rule(n, ref(n).dim())))]
        return bad + (["<keys>"] if sorted(sd) != sorted(SHARD) else [])

    # Per-rank requests: overlapping, disjoint, steps, ints, None, whole tensors; rank-dependent.
    def my_slices():
        r = rank
        req = [("embed.weight", (slice(10 * r, 10 * r + 30), slice(None))),
               ("layers.0.q.weight", (slice(None), slice(8 * r, 8 * r + 8))),
               ("layers.1.o.weight", (slice(None, None, 2), slice(1, 40))),
               ("conv", (r % 6, slice(None), None, slice(1, 3))),
               ("step", ...), ("mask", (slice(None), slice(r, r + 1)))]
        if r == 1:
            req.append(("layers.0.norm", slice(5, 9)))
        if r != 0:
            req.append(("f8", (slice(-4, None), ...)))
        return req

    def inject(fail_call):
        real, calls = _distributed._read_boxes, [0]
        def failing(reader, targets):
            calls[0] += 1
            if calls[0] == fail_call:
                raise _errors.make_error(ckptio._ckptio.E_IO, "E_IO", 5, 0, "pread", "/injected/shard", 4096,
                                         None, f"/injected/shard: pread at offset 4096: injected on rank {rank} "
                                         f"(thread {threading.current_thread().name})")
            return real(reader, targets)
        _distributed._read_boxes = failing
        return real

    def scenario(sc):
        kind, fail = sc["kind"], sc.get("fail_rank") == rank
        if kind == "replicas":
            sd = ckptio.load(MODEL, device="cpu", process_group=pg)
            return [n for n in SHARD if not same(sd[n], ref(n))] + (["<keys>"] if sorted(sd) != sorted(SHARD) else [])
        if kind == "replicas_batches":  # several batches: the reads of the next one run ahead
            with ckptio.open(MODEL) as f:
                got = f.get_slices({n: ... for n in SHARD}, process_group=pg, batch_bytes=sc["batch_bytes"])
            return [n for n in SHARD if not same(got[n], ref(n))]
        if kind == "replicas_load_batches":  # ckptio.load's batch_bytes: replicated tensors cut into row parts
            sd = ckptio.load(MODEL, device="cpu", process_group=pg, batch_bytes=sc["batch_bytes"])
            return [n for n in SHARD if not same(sd[n], ref(n))] + (["<keys>"] if sorted(sd) != sorted(SHARD) else [])
        if kind == "tp_rows":
            return check_tp(ckptio.load(MODEL, process_group=pg, tp_dim=0), lambda n, nd: 0 if nd >= 2 else None)
        if kind == "tp_cols":
            return check_tp(ckptio.load(MODEL, process_group=pg, tp_dim=-1), lambda n, nd: -1 if nd >= 2 else None)
        if kind == "tp_rule":
            rule = {"*.q.weight": 0, "*.o.weight": 1, "embed.*": 1, "conv": 2}
            want = lambda n, nd: {"q": 0, "o": 1}.get(n.split(".")[-2]) if n.startswith("layers") and nd == 2 \\
                else (1 if n.startswith("embed") else (2 if n == "conv" else None))
            return check_tp(ckptio.load(MODEL, process_group=pg, tp_dim=rule), want)
        if kind == "slices":
            req = my_slices()
            with ckptio.open(MODEL) as f:
                got = f.get_slices(req, process_group=pg, batch_bytes=sc.get("batch_bytes"))
            return [f"{n} {i!r}" for (n, i), t in zip(req, got) if not same(t, ref(n, i))]
        if kind == "load_slices":
            got = ckptio.load(MODEL, process_group=pg, slices=dict(my_slices()))
            return [n for n, i in my_slices() if not same(got[n], ref(n, i))]
        if kind == "missing_shard":
            return ckptio.load(BROKEN if fail else MODEL, process_group=pg)
        if kind == "differs":
            return ckptio.load(OTHER if fail else MODEL, process_group=pg)
        if kind == "bad_name":
            return ckptio.load(MODEL, process_group=pg, keys=list(SHARD) + (["nope"] if fail else []))
        if kind == "bad_box":
            req = {"embed.weight": slice(200, 300) if fail else slice(0, 5)}
            with ckptio.open(MODEL) as f:
                return f.get_slices([ckptio.SliceRequest("embed.weight", (200, 0), (300, 40), 0, None)] if fail
                                    else req, process_group=pg)
        if kind == "transport":
            # The collectives a column load moves its shared tensors with: by default in groups of up to 4 ranks,
            # the owners' broadcasts (every other rank cuts its pieces out); forced to all_to_all, one
            # all_to_all_single per batch (_group_read.scatter_whole).
            calls = {"all_to_all_single": 0, "broadcast": 0}
            real = {n: getattr(dist, n) for n in calls}
            def counted(n):
                def call(*a, **k):
                    calls[n] += 1
                    return real[n](*a, **k)
                return call
            for n in calls:
                setattr(dist, n, counted(n))
            try:
                bad = check_tp(ckptio.load(MODEL, process_group=pg, tp_dim=-1), lambda n, nd: -1 if nd >= 2 else None)
            finally:
                for n in calls:
                    setattr(dist, n, real[n])
            want_a2a = sc.get("scatter") == "all_to_all"
            if (calls["all_to_all_single"] > 0) != want_a2a or (not want_a2a and calls["broadcast"] == 0):
                bad.append(f"collectives {calls} for {world} ranks")
            return bad
        if kind in ("read_direct", "read_owner"):
            real = inject(sc["fail_call"]) if fail else None
            try:
                if kind == "read_direct":
                    return ckptio.load(MODEL, process_group=pg, tp_dim=0)
                with ckptio.open(MODEL) as f:
                    return f.get_slices({n: ... for n in SHARD}, process_group=pg, batch_bytes=sc["batch_bytes"])
            finally:
                if real is not None:
                    _distributed._read_boxes = real
        raise ValueError(kind)

    whole_max = _group_read.SCATTER_WHOLE_MAX_RANKS
    for sc in cfg["scenarios"]:
        # _group_read.scatter_whole reads the bound at each load: 0 sends every scatter by all_to_all.
        _group_read.SCATTER_WHOLE_MAX_RANKS = 0 if sc.get("scatter") == "all_to_all" else whole_max
        try:
            bad = scenario(sc)
            res = {"ok": True, "bad": bad if isinstance(bad, list) else []}
        except Exception as e:
            if not isinstance(e, ckptio.CkptioError):
                traceback.print_exc()
            res = {"ok": False, "type": type(e).__name__, "status": getattr(e, "status_name", None),
                   "msg": str(e), "failed": getattr(e, "failed_ranks", None),
                   "cause": repr(e.__cause__) if e.__cause__ is not None else None}
        st = ckptio.last_load_stats()
        res["stats"] = st._asdict() if st is not None else None
        print("RESULT", sc["name"], json.dumps(res), flush=True)
    dist.barrier()
    print("DONE", rank, flush=True)
    os._exit(0)  # skip interpreter teardown (gloo's threads; see test_dcp_broadcast.py)
    """
)


def run_ranks(tmp_path, world, scenarios, timeout=150):
    tensors = make_tensors()
    model, other, broken = tmp_path / "model", tmp_path / "other", tmp_path / "broken"
    if not model.exists():
        weight_map = write_model(model, tensors)
        write_model(other, {**tensors, "embed.weight": torch.zeros(100, 40, dtype=torch.float16)})
        shutil.copytree(model, broken)
        os.remove(broken / weight_map["embed.weight"])
    (tmp_path / "worker.py").write_text(WORKER)
    store = tmp_path / f"store-{world}-{len(os.listdir(tmp_path))}"
    cfg = {"model": str(model), "other": str(other), "broken": str(broken), "scenarios": scenarios}
    env = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), str(r), str(world), str(store),
                               json.dumps(cfg)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()  # a hang fails the test instead of blocking the suite
    results = {}
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"DONE {r}" in out, f"rank {r} of {world}:\n{out[-4000:]}"
        for line in out.splitlines():
            if line.startswith("RESULT "):
                _, name, text = line.split(" ", 2)
                results.setdefault(name, []).append(json.loads(text))
    assert all(len(v) == world for v in results.values()), results
    return results, tensors


SUCCESS = [
    {"name": "replicas", "kind": "replicas"},
    {"name": "replicas_batches", "kind": "replicas_batches", "batch_bytes": 3000},
    {"name": "replicas_load_batches", "kind": "replicas_load_batches", "batch_bytes": 2000},
    {"name": "tp_rows", "kind": "tp_rows"},
    {"name": "tp_cols", "kind": "tp_cols"},
    {"name": "tp_rule", "kind": "tp_rule"},
    {"name": "slices", "kind": "slices"},
    {"name": "slices_batches", "kind": "slices", "batch_bytes": 1000},
    {"name": "load_slices", "kind": "load_slices"},
    {"name": "transport", "kind": "transport"},
    {"name": "tp_cols_all_to_all", "kind": "tp_cols", "scatter": "all_to_all"},
    {"name": "transport_all_to_all", "kind": "transport", "scatter": "all_to_all"},
]


@pytest.fixture(scope="module", params=[2, 3])
def loads(request, tmp_path_factory):
    """Every success scenario, in one process group of 2 or 3 ranks."""
    world = request.param
    results, tensors = run_ranks(tmp_path_factory.mktemp(f"w{world}"), world, SUCCESS)
    return world, results, model_bytes(tensors)


def _checked(results, name):
    rs = results[name]
    for r, res in enumerate(rs):
        assert res["ok"], f"{name}, rank {r}: {res}"
        assert res["bad"] == [], f"{name}, rank {r}: not byte-exact: {res['bad']}"
        assert res["stats"]["ok"] and res["stats"]["rank"] == r
    return [res["stats"] for res in rs]


def test_replicas_read_every_byte_once(loads):
    world, results, total = loads
    for name in ("replicas", "replicas_batches", "replicas_load_batches"):
        stats = _checked(results, name)
        assert sum(s["bytes_read"] for s in stats) == total, name  # once overall, not world x
        assert all(s["bytes_read"] < total for s in stats), name  # shared out between the ranks
        # Every byte a rank did not read itself came over the group.
        assert all(s["bytes_received"] == total - s["bytes_read"] for s in stats), name
        assert all(s["bytes_loaded"] == total for s in stats)


def test_tensor_parallel_rows_columns_and_rules(loads):
    world, results, total = loads
    for name in ("tp_rows", "tp_cols", "tp_rule", "tp_cols_all_to_all"):
        stats = _checked(results, name)
        assert sum(s["bytes_read"] for s in stats) == total, name  # the parts cover the model exactly once
    # Cut by the owner (all_to_all), a rank receives only bytes it returns. By default (up to 4 ranks) a scattered
    # tensor travels whole to every other rank (_group_read.scatter_whole), which cuts its part out: more arrives.
    a2a = _checked(results, "tp_cols_all_to_all")
    assert all(s["bytes_received"] <= s["bytes_loaded"] for s in a2a)
    whole = _checked(results, "tp_cols")
    assert sum(s["bytes_received"] for s in whole) > sum(s["bytes_received"] for s in a2a)
    rows = _checked(results, "tp_rows")
    # Rows are single runs: each rank reads its own rows, only 0-D and 1-D tensors move.
    small = 2 * 40 * 4 + 8  # layers.*.norm and step
    assert all(s["bytes_received"] <= small for s in rows)
    cols = _checked(results, "tp_cols")
    assert sum(s["bytes_received"] for s in cols) > small  # columns are read whole once and scattered
    _checked(results, "transport")
    _checked(results, "transport_all_to_all")


def test_per_rank_slices(loads):
    world, results, total = loads
    for name in ("slices", "slices_batches", "load_slices"):
        stats = _checked(results, name)
        assert all(s["bytes_read"] + s["bytes_received"] >= s["bytes_loaded"] for s in stats)


FAILURES = [
    {"name": "missing_shard", "kind": "missing_shard", "fail_rank": 1},
    {"name": "after_missing", "kind": "replicas"},
    {"name": "read_direct", "kind": "read_direct", "fail_rank": 1, "fail_call": 1},
    {"name": "read_owner", "kind": "read_owner", "fail_rank": 0, "fail_call": 2, "batch_bytes": 3000},
    {"name": "bad_name", "kind": "bad_name", "fail_rank": 1},
    {"name": "bad_box", "kind": "bad_box", "fail_rank": 0},
    {"name": "differs", "kind": "differs", "fail_rank": 1},
    {"name": "after_all", "kind": "tp_cols"},
]


@pytest.mark.parametrize("world", [2, 3])
def test_failure_on_one_rank_stops_every_rank_with_the_same_error(tmp_path, world):
    results, tensors = run_ranks(tmp_path, world, FAILURES)

    def same_error(name, status, fail_rank, *words):
        rs = results[name]
        for r, res in enumerate(rs):
            assert not res["ok"], f"{name}: rank {r} did not fail: {res}"
            assert res["type"].startswith("Ckptio") and res["status"] == status, f"{name}, rank {r}: {res}"
            assert "load-once broadcast stopped" in res["msg"] and all(w in res["msg"] for w in words), res["msg"]
            assert res["stats"] is not None and not res["stats"]["ok"]
        assert len({(res["type"], res["msg"]) for res in rs}) == 1, f"{name}: the ranks differ: {rs}"
        if fail_rank is not None:
            assert all(res["failed"] == [fail_rank] for res in rs), rs
            assert rs[fail_rank]["cause"] is not None  # the failing rank keeps its own error as the cause

    same_error("missing_shard", "E_NOT_FOUND", 1, "rank(s) [1]", "broken", ".safetensors")
    same_error("read_direct", "E_IO", 1, "injected on rank 1", "/injected/shard")
    same_error("read_direct", "E_IO", 1, "(thread MainThread)")
    # The second owner read of rank 0 runs ahead, on the helper thread, while a batch is exchanged.
    same_error("read_owner", "E_IO", 0, "injected on rank 0", "(thread ckptio-group-read")
    same_error("bad_name", "E_NOT_FOUND", 1, "no tensor named 'nope'")
    same_error("bad_box", "E_RANGE", 0, "embed.weight", "not inside it")
    same_error("differs", "E_INVAL", None, "rank(s) [1] opened a model that differs", "other")
    # The group stays usable: the loads after the failures succeed, byte-exact.
    for name in ("after_missing", "after_all"):
        stats = _checked(results, name)
        assert sum(s["bytes_read"] for s in stats) == model_bytes(tensors)


# ---- in one process: the plan, the API's checks ---------------------------------------------------


@pytest.fixture()
def model(tmp_path):
    tensors = make_tensors()
    write_model(tmp_path / "m", tensors)
    with ckptio.open(tmp_path / "m") as f:
        yield f, tensors


def _requests(f, per_rank):
    return [[_distributed._checked(f, r) for r in f.plan_slices(reqs)] for reqs in per_rank]


def test_plan_replicas_are_broadcast_and_balanced(model):
    f, tensors = model
    whole = [(n, ...) for n in f.keys()]
    plan = _distributed.make_plan(f, _requests(f, [whole] * 3), 1 << 30)
    shares = [s for b in plan.batches for s in b]
    assert sorted(s.name for s in shares) == sorted(n for n in tensors if n != "empty")
    assert all(s.pieces is None for s in shares)  # every rank needs all of it: broadcast
    assert sum(plan.read_bytes) == model_bytes(tensors)
    largest = max(t.numel() * t.element_size() for t in tensors.values())
    assert max(plan.read_bytes) - min(plan.read_bytes) <= largest
    assert plan.direct == {0: [f.keys().index("empty")], 1: [f.keys().index("empty")],
                           2: [f.keys().index("empty")]}
    # Small batches: cut in model order; a tensor larger than budget / world is cut into parts of whole
    # rows (one row at least) that tile it in order and that different ranks read side by side.
    small = _distributed.make_plan(f, _requests(f, [whole] * 3), 3000)
    parts = [s for b in small.batches for s in b]
    assert len(small.batches) > 3 and all(sum(s.nbytes for s in b) <= 3000 or len(b) == 1 for b in small.batches)
    assert [n for i, n in enumerate(s.name for s in parts) if i == 0 or parts[i - 1].name != n] == \
        [n for n in f.offset_keys() if n != "empty"]
    assert sum(small.read_bytes) == model_bytes(tensors)
    for name in f.keys():
        mine = [s for s in parts if s.name == name]
        if len(mine) < 2:
            continue
        shape = tuple(tensors[name].shape)
        assert all(s.part and s.pieces is None and s.start[1:] == (0,) * (len(shape) - 1) and s.stop[1:] == shape[1:]
                   for s in mine)
        assert [s.start[0] for s in mine] == [0] + [s.stop[0] for s in mine[:-1]] and mine[-1].stop[0] == shape[0]
        row = tensors[name][0].numel() * tensors[name].element_size()
        assert all(s.nbytes <= max(row, 1000) for s in mine)
        assert len({s.owner for s in mine}) > 1, f"{name}: every part read by one rank"


def test_plan_rows_direct_columns_scattered(model, monkeypatch):
    f, tensors = model
    name = "layers.0.o.weight"  # 40 x 48 float32: a row is 192 bytes
    rows = [[(name, slice(0, 20))], [(name, slice(20, 40))]]
    plan = _distributed.make_plan(f, _requests(f, rows), 1 << 30)
    assert plan.batches == [] and plan.direct == {0: [0], 1: [0]}  # one run each: read directly
    cols = [[(name, (slice(None), slice(0, 24)))], [(name, (slice(None), slice(24, 48)))]]
    plan = _distributed.make_plan(f, _requests(f, cols), 1 << 30)
    (share,) = plan.batches[0]
    assert share.pieces == ((0, 40 * 24 * 4), (1, 40 * 24 * 4)) and share.nbytes == 40 * 48 * 4
    assert (share.start, share.stop) == ((0, 0), (40, 48))
    # Runs at least DIRECT_RUN_MIN long (96 bytes here) are read directly too.
    monkeypatch.setattr(_distributed, "DIRECT_RUN_MIN", 96)
    plan = _distributed.make_plan(f, _requests(f, cols), 1 << 30)
    assert plan.batches == [] and plan.direct == {0: [0], 1: [0]}
    # Overlapping boxes, not every rank: scattered, each its own box; the covering box read once.
    part = [[(name, slice(0, 30))], [(name, slice(10, 40))], []]
    plan = _distributed.make_plan(f, _requests(f, part), 1 << 30)
    (share,) = plan.batches[0]
    assert share.pieces == ((0, 30 * 192), (1, 30 * 192)) and share.nbytes == 40 * 192 and share.owner in (0, 1)


def test_tp_requests_split_like_tensor_split(model):
    f, tensors = model
    for world in (2, 3):
        for rank in range(world):
            for rule in (0, -1, {"embed.*": 1, "conv": 2}, lambda n, s: 0 if n == "mask" else None):
                reqs = dict(_distributed.tp_requests(f, f.keys(), rule, rank, world))
                got = f.get_slices(reqs)
                for n, t in tensors.items():
                    dim = _distributed._tp_dim(rule, n, tuple(t.shape))
                    want = t if dim is None else torch.tensor_split(t, world, dim)[rank]
                    assert same_bytes(got[n], want), n
    with pytest.raises(ValueError, match="tp_dim gives dim 2"):
        _distributed.tp_requests(f, ["mask"], {"mask": 2}, 0, 2)
    with pytest.raises(TypeError, match="tp_dim must be"):
        _distributed.tp_requests(f, ["mask"], "rows", 0, 2)


def test_api_checks_without_a_group(model):
    f, tensors = model
    with pytest.raises(ValueError, match="tp_dim= splits tensors"):
        ckptio.load(f.path, tp_dim=0)
    with pytest.raises(ValueError, match="out=, progress="):
        ckptio.load(f.path, process_group=object(), out={})
    got = ckptio.load(f.path, slices={"embed.weight": slice(3, 9)})  # no group: get_slices
    assert same_bytes(got["embed.weight"], tensors["embed.weight"][3:9])
    with pytest.raises(RuntimeError, match="init_process_group"):
        ckptio.load(f.path, process_group=object())


def test_batch_bytes_needs_a_process_group(model):
    f, _ = model
    with pytest.raises(ValueError, match="batch_bytes= sizes the exchange"):
        ckptio.load(f.path, batch_bytes=1 << 20)


def test_scatter_whole_up_to_four_ranks():
    from ckptio import _group_read

    assert [_group_read.scatter_whole(w) for w in (2, 3, 4, 5, 8)] == [True, True, True, False, False]
