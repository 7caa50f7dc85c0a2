"""Execute notebooks on the GPU machine with nbclient on the ``krex`` kernel (real GPU, nvidia backend).

    python benchmarks/lab/notebook_device.py notebooks/02_optimize_a_kernel.ipynb [...] [--timeout 300]

Starts its own arbiter (private KREX_RUNTIME_DIR / KREX_ENDPOINT) and makes the ``krex``
kernelspec findable where krex_lab is not pip-installed (JUPYTER_PATH = the repo's
extension/share/jupyter, and the provisioner's entry point from a temporary dist-info, as
multi_gpu.py does). Kernels run on GPU 0 (KREX_GPU=0). Each executed notebook is saved next to
the results (and under $OUT); the JSON (benchmarks/out/notebook_device-<date>.json) has, per
notebook, whether it ran, how long, the error if any and each code cell's text output.
Without a GPU it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "regions"))  # fidelity
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multigpu"))  # multi_gpu_placement
from common import OUTPUT, REPO, machine, write_result
from fidelity import start_arbiter, stop_arbiter
from multi_gpu_placement import ensure_provisioner_entry_point


def has_gpu() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    return probe.returncode == 0 and "GPU" in probe.stdout


def cell_text(cell: Any, limit: int = 3000) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if o["output_type"] == "stream":
            parts.append(o["text"])
        elif o["output_type"] == "execute_result":
            parts.append(o["data"].get("text/plain", ""))
        elif o["output_type"] == "error":
            parts.append(f"{o['ename']}: {o['evalue']}")
    text = "".join(parts)
    return text if len(text) <= limit else text[:limit] + " …"


def run_notebook(path: Path, timeout: float, workdir: Path) -> dict[str, Any]:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    entry: dict[str, Any] = {"notebook": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)}
    t0 = time.monotonic()
    try:
        client = NotebookClient(nb, timeout=timeout, kernel_name="krex", resources={"metadata": {"path": str(workdir)}})
        client.execute()
        entry["ok"] = True
    except CellExecutionError as exc:
        entry["ok"] = False
        entry["error"] = str(exc)[-4000:]
    except Exception as exc:  # the kernel did not start, a timeout, ...
        entry["ok"] = False
        entry["error"] = f"{type(exc).__name__}: {exc}"[-4000:]
    entry["seconds"] = round(time.monotonic() - t0, 1)
    entry["cells"] = [
        {"source": c.source.splitlines()[0] if c.source else "", "output": cell_text(c)}
        for c in nb.cells
        if c.cell_type == "code"
    ]
    name = path.stem + "-executed.ipynb"
    for folder in filter(None, [OUTPUT, os.environ.get("OUT")]):
        nbformat.write(nb, Path(folder, name))
    entry["executed"] = name
    return entry


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per cell")
    args = p.parse_args()
    if not has_gpu():
        print(
            "notebook_device: no NVIDIA GPU here (nvidia-smi -L lists none); nothing run. "
            "Run it on the GPU machine: bash benchmarks/device_run.sh bench",
            file=sys.stderr,
        )
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="krex-notebooks-"))
    share = REPO / "extension" / "share" / "jupyter"
    env = {
        **os.environ,
        "KREX_RUNTIME_DIR": str(tmp),
        "KREX_ENDPOINT": f"ipc://{tmp}/arbiter.sock",
        "KREX_GPU": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "JUPYTER_PATH": os.pathsep.join(filter(None, [str(share), os.environ.get("JUPYTER_PATH")])),
    }
    os.environ.update(
        {k: env[k] for k in ("KREX_RUNTIME_DIR", "KREX_ENDPOINT", "KREX_GPU", "PYTHONPATH", "JUPYTER_PATH")}
    )
    entry_point = ensure_provisioner_entry_point(tmp)
    arbiter, hello = start_arbiter(env, "nvidia", tmp / "arbiter.log")
    doc: dict[str, Any] = {
        "benchmark": "notebook_device",
        "machine": machine(),
        "backend": hello.get("backend"),
        "provisioner": entry_point,
        "notebooks": [],
    }
    try:
        for nb in args.notebooks:
            entry = run_notebook(nb.resolve(), args.timeout, tmp)
            doc["notebooks"].append(entry)
            print(f"{entry['notebook']}: {'ran' if entry['ok'] else 'FAILED'} in {entry['seconds']} s")
            for cell in entry["cells"]:
                print(f"  >>> {cell['source'][:70]}")
                for line in cell["output"].splitlines()[:12]:
                    print(f"      {line}")
            if not entry["ok"]:
                print(entry["error"])
    finally:
        stop_arbiter(arbiter)
    write_result("notebook_device", doc)
    return 0 if all(e["ok"] for e in doc["notebooks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
