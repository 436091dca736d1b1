"""`hone doctor`: what this machine gives hone, before a run is started on it.

One report (a dict; `format_report` prints it): the JAX backend and its devices with their memory
(the device's own allocator figures where JAX has them, the host's RAM for the CPU), whether the
code tool's sandbox works here (and what its programs see), which of
hone's own kernels run here (the CPU decode kernels: hone/kernels/compiler.py decides), which
attention path `model.attention: auto` takes on this backend (hone/models/attention.py's
`attention_path`, asked for a short and a long row), and the installed versions against the
tested set (requirements/lock.txt) and pyproject's ranges. It only reports: a mismatch is
flagged, never fixed, and the command exits 0 so scripts may collect it from any machine.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys
from pathlib import Path

# The lock of a source checkout (an editable install): hone/ sits beside requirements/.
DEFAULT_LOCK = Path(__file__).resolve().parent.parent / "requirements" / "lock.txt"
# jax's accelerator builds: not in the CPU lock, reported when present.
PLUGINS = ("jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda13-pjrt",
           "libtpu")


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name
    return str(canonicalize_name(name))


def read_lock(path: str | os.PathLike) -> dict[str, str]:
    """name (canonical) -> version of every `name==version` line; comments and blanks skipped."""
    pins = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"{path}: not a name==version line: {line!r}")
        pins[_canonical(name)] = version.strip()
    return pins


def _installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def versions(lock: str | os.PathLike | None = DEFAULT_LOCK) -> dict:
    """The lock's pins against what is installed, and hone's declared ranges against it.

    A pin matches when the installed version satisfies `==pin` (so 2.13.0+cpu matches 2.13.0).
    A pinned package that is not installed is listed as missing, not as a mismatch: after
    `make demo` the test extras are absent by design."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    out = {"hone": _installed("hone"), "lock": None, "mismatched": {}, "missing": [],
           "matched": 0, "out_of_range": {},
           "plugins": {p: v for p in PLUGINS if (v := _installed(p)) is not None}}
    if lock is not None and Path(lock).is_file():
        out["lock"] = str(lock)
        for name, pin in sorted(read_lock(lock).items()):
            have = _installed(name)
            if have is None:
                out["missing"].append(name)
            elif SpecifierSet(f"=={pin}").contains(have, prereleases=True):
                out["matched"] += 1
            else:
                out["mismatched"][name] = {"installed": have, "locked": pin}
    # hone's own requirements (runtime ones only: no extra marker) against what is installed.
    for text in (md.requires("hone") or []) if out["hone"] else []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        have = _installed(req.name)
        if have is None or not req.specifier.contains(have, prereleases=True):
            out["out_of_range"][req.name] = {"installed": have, "required": str(req.specifier)}
    return out


def host_memory() -> dict:
    """The host's RAM in bytes: total, and available where the OS says (Linux)."""
    out = {"total": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "available": None}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                out["available"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def devices() -> list[dict]:
    """Every device JAX sees: id, platform, kind, and its memory (bytes) where JAX reports it."""
    import jax
    out = []
    for d in jax.devices():
        stats = None
        try:
            stats = d.memory_stats()
        except Exception:  # noqa: BLE001  (backends without the call raise different errors)
            pass
        memory = None
        if stats:
            memory = {k: int(stats[k]) for k in ("bytes_limit", "bytes_in_use",
                                                  "peak_bytes_in_use") if k in stats}
        out.append({"id": d.id, "platform": d.platform, "kind": d.device_kind,
                    "process": d.process_index, "memory": memory})
    return out


def kernels() -> dict:
    """Whether the sampler's decode steps use hone's CPU kernels here, and why not if not."""
    import jax

    from hone.kernels import compiler as build
    backend = jax.default_backend()
    if backend != "cpu":
        return {"cpu_decode_kernels": False,
                "why": f"the backend is {backend}: XLA's own kernels run everywhere"}
    if os.environ.get("HONE_CPU_KERNELS", "1") == "0":
        return {"cpu_decode_kernels": False, "why": "HONE_CPU_KERNELS=0"}
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reason is reported below instead
        lib = build.library()
    if lib is not None:
        return {"cpu_decode_kernels": True, "panel_width": build.panel_width(),
                "why": "CPU backend, kernels built (one device: a mesh uses XLA's products)"}
    try:
        build.build()
        why = "built but could not be loaded"
    except build.Unavailable as e:
        why = str(e).splitlines()[0]
    return {"cpu_decode_kernels": False, "why": why}


def attention() -> dict:
    """The path model.attention=auto takes for a row that fits one block, and for a longer one."""
    from hone.models.attention import attention_path
    from hone.models.blockwise import DEFAULT_BLOCK
    long = DEFAULT_BLOCK + 1
    return {"block": DEFAULT_BLOCK,  # short rows: at most this many tokens
            "short_rows": attention_path("auto", DEFAULT_BLOCK, DEFAULT_BLOCK, DEFAULT_BLOCK),
            "long_rows": attention_path("auto", long, long, DEFAULT_BLOCK)}


def paged_attention(kernel_report: dict) -> str:
    """How the rollout engine's decode step attends over its page pool here
    (`hone.sampling.paged.paged_route` decides)."""
    import jax

    from hone.sampling.paged import TPU_HEAD_DIM, paged_route, rollout_engine

    route = paged_route()
    if route is not None:
        text = (f"Pallas paged attention (jax.experimental.pallas.ops.{route}); "
                "sliding-window layers: XLA, one page per block")
    elif kernel_report["cpu_decode_kernels"]:
        text = "hone's CPU decode kernel, reading each row's pages itself"
    else:
        text = "XLA gathers, one page per block of a running softmax"
    if jax.default_backend() == "tpu":
        text += (" (the Pallas TPU kernel measured slower; PagedEngine(attention='tpu') takes it, "
                 f"for head_dim a multiple of {TPU_HEAD_DIM}; attention='ragged' hone's ragged "
                 "kernel, not yet measured on a TPU)")
    from hone.sampling.windows import default_overlap, default_window
    text += (f"; decode windows of {default_window()} steps, "
             f"{'dispatched before the last is read' if default_overlap() else 'read at once'}"
             f"{', a fixed trip count' if jax.default_backend() == 'gpu' else ''}"
             "; prefill in blocks of 32 tokens over XLA's loop over pages; a fixed set of "
             "programs (PagedEngine.warmup compiles them)")
    return text + f"; RL rollouts with engine=auto: {rollout_engine('auto')}"


def code_tool() -> dict:
    """Whether the code tool's sandbox works here (hone/agents/code_sandbox.py probes it)."""
    from hone.agents.code_tool import sandbox_status
    status = sandbox_status()
    return {"confined": status.confined, "why_not": status.reason, "view": list(status.view)}


def collect(lock: str | os.PathLike | None = DEFAULT_LOCK) -> dict:
    """The whole report as one JSON-able dict."""
    import jax
    return {"python": platform.python_version(), "platform": platform.platform(),
            "backend": jax.default_backend(), "device_count": jax.device_count(),
            "process_count": jax.process_count(), "devices": devices(),
            "host_memory": host_memory(), "kernels": (k := kernels()),
            "attention": attention(), "paged_attention": paged_attention(k),
            "code_tool": code_tool(), "versions": versions(lock)}


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2 ** 30:.1f} GiB"


def format_report(r: dict) -> str:
    """The report as the lines `hone doctor` prints."""
    v = r["versions"]
    lines = [f"python {r['python']} on {r['platform']}",
             f"hone {v['hone']}; backend {r['backend']}: {r['device_count']} device(s), "
             f"{r['process_count']} process(es)"]
    for d in r["devices"]:
        m = d["memory"]
        mem = (f"{_gib(m.get('bytes_limit'))} limit, {_gib(m.get('bytes_in_use'))} in use"
               if m else "memory: the host's RAM")
        lines.append(f"  device {d['id']}: {d['kind']} ({d['platform']}), {mem}")
    h = r["host_memory"]
    lines.append(f"host RAM: {_gib(h['total'])} total, {_gib(h['available'])} available")
    k = r["kernels"]
    state = f"on (panel width {k['panel_width']})" if k["cpu_decode_kernels"] else "off"
    lines.append(f"CPU decode kernels: {state}: {k['why']}")
    a = r["attention"]
    lines.append(f"model.attention=auto: {a['short_rows']} for rows up to {a['block']} "
                 f"tokens, {a['long_rows']} for longer rows")
    if "paged_attention" in r:
        lines.append(f"rollout engine's attention over pages: {r['paged_attention']}")
    if "code_tool" in r:
        c = r["code_tool"]
        lines.append("code tool: confined; its programs see /" + ", /".join(c["view"])
                     if c["confined"] else f"code tool: NO SANDBOX here ({c['why_not']}); runs "
                     "with it refuse to start unless agent.code_tool.unconfined: true")
    if v["lock"] is None:
        lines.append("versions: no lock file found (pass --lock requirements/lock.txt from a "
                     "checkout)")
    else:
        lines.append(f"versions against {v['lock']}: {v['matched']} as locked, "
                     f"{len(v['mismatched'])} different, {len(v['missing'])} not installed")
        for name, m in v["mismatched"].items():
            lines.append(f"  DIFFERENT {name}: installed {m['installed']}, locked {m['locked']}")
        if v["missing"]:
            lines.append(f"  not installed (after `make demo` or a plain install: the test "
                         f"extras, the shipped models): {', '.join(v['missing'])}")
    for name, m in v["out_of_range"].items():
        lines.append(f"  OUT OF RANGE {name}: installed {m['installed']}, hone needs "
                     f"{m['required']}")
    if v["plugins"]:
        lines.append("accelerator builds: " + ", ".join(f"{k} {x}" for k, x in
                                                         v["plugins"].items()))
    return "\n".join(lines)


def run_doctor(args, out=None) -> int:
    """`hone doctor [--json] [--lock FILE]`: print the report; always 0."""
    import json
    report = collect(args.lock)
    (out or sys.stdout).write((json.dumps(report) if args.json else format_report(report)) + "\n")
    return 0
