"""Point SAPIEN's Vulkan loader at the project's Mesa lavapipe and report what works.

``fetch_mesa.sh`` (shipped beside this module; run by ``vlm-grpoma fetch-mesa`` and ``make setup``) unpacks
Mesa >= 25 lavapipe into ``<cache>/mesa`` and writes ``lvp_icd.json`` (the cache:
:func:`vlm_grpoma.cache.cache_dir`). ``configure_icd`` exports
``VK_ICD_FILENAMES`` before SAPIEN creates its renderer (a user's own setting wins). The status probes are
what ``vlm-grpoma env`` prints; the rendering probe runs in a child process because a broken Vulkan driver
can abort the process that tries it.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import warnings
from importlib import resources
from pathlib import Path

from vlm_grpoma.cache import cache_dir
from vlm_grpoma.errors import MissingDependencyError

PROBE_TIMEOUT_S = 120
#: The fetch script (package data), run with bash: ``fetch_mesa.sh DEST``.
FETCH_SCRIPT = resources.files("vlm_grpoma.envs.sapien") / "fetch_mesa.sh"


def mesa_dir() -> Path:
    return cache_dir() / "mesa"


def icd_path() -> Path | None:
    path = mesa_dir() / "lvp_icd.json"
    return path if path.is_file() else None


def configure_icd() -> str | None:
    """Export VK_ICD_FILENAMES for the project's lavapipe unless already set; returns the value in effect."""
    if not os.environ.get("VK_ICD_FILENAMES"):
        path = icd_path()
        if path is not None:
            os.environ["VK_ICD_FILENAMES"] = str(path)
    return os.environ.get("VK_ICD_FILENAMES")


def import_sapien():
    """Import SAPIEN lazily, after pointing Vulkan at the project's lavapipe, with a clear message where it
    is missing. SAPIEN's warning that it falls back to its bundled Vulkan loader is expected here."""
    configure_icd()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Failed to find system libvulkan")
            import sapien
    except ImportError as err:  # pragma: no cover - depends on the platform
        raise RuntimeError(
            "SAPIEN 3 is not installed (it ships wheels for x86_64 Linux, CPython 3.10-3.13 only)"
        ) from err
    return sapien


def _missing_reason() -> str:
    failed = mesa_dir() / "FAILED"
    detail = f" ({failed.read_text().strip()})" if failed.is_file() else ""
    return (
        f"no Vulkan ICD: {mesa_dir() / 'lvp_icd.json'} is missing{detail}; "
        "run `vlm-grpoma fetch-mesa` or set VK_ICD_FILENAMES"
    )


def fetch_mesa(dest: Path | None = None) -> Path:
    """Fetch Mesa lavapipe into ``dest`` (default ``<cache>/mesa``) with the shipped script; the ICD file, or
    MissingDependencyError with the script's reason (no apt, no mirror, an old Mesa, no network)."""
    dest = dest or mesa_dir()
    with resources.as_file(FETCH_SCRIPT) as script:
        proc = subprocess.run(["bash", str(script), str(dest)])
    failed = dest / "FAILED"
    if failed.is_file():
        raise MissingDependencyError(f"Mesa lavapipe not fetched into {dest}: {failed.read_text().strip()}")
    icd = dest / "lvp_icd.json"
    if proc.returncode != 0 or not icd.is_file():
        raise MissingDependencyError(f"{FETCH_SCRIPT.name} exited with {proc.returncode}; {icd} is missing")
    return icd


def fetch_main(args: argparse.Namespace) -> int:
    """``vlm-grpoma fetch-mesa`` handler."""
    icd = fetch_mesa(Path(args.dest) if args.dest else None)
    if icd == mesa_dir() / "lvp_icd.json":
        print(f"Vulkan ICD {icd}: SAPIEN uses it from the cache ({cache_dir()})")
    else:
        print(f"Vulkan ICD {icd}: outside the cache, so export VK_ICD_FILENAMES={icd} before rendering")
    return 0


_PROBE = """
from vlm_grpoma.envs.sapien.vulkan import import_sapien
sapien = import_sapien()
scene = sapien.Scene([sapien.physx.PhysxCpuSystem(), sapien.render.RenderSystem()])
b = scene.create_actor_builder(); b.add_box_visual(half_size=[0.1, 0.1, 0.1]); b.build_kinematic()
cam = scene.add_camera("c", 16, 16, 1.0, 0.01, 10.0)
scene.update_render(); cam.take_picture(); cam.get_picture("Color")
print("RENDER_OK")
"""


@functools.lru_cache(maxsize=2)
def rendering_status(in_process: bool = False) -> tuple[bool, str]:
    """(True, description) when SAPIEN can render here, else (False, why not). ``in_process`` creates the
    renderer in this process (cheap; for code about to render); otherwise a child process renders a frame."""
    env = dict(os.environ)
    icd = configure_icd()
    if icd:
        env["VK_ICD_FILENAMES"] = icd
    elif sys.platform.startswith("linux"):
        return False, _missing_reason()
    if in_process:
        try:
            import_sapien().render.RenderSystem()
        except RuntimeError as err:
            return False, f"SAPIEN cannot render with VK_ICD_FILENAMES={icd}: {err}"
        return True, f"SAPIEN renders with VK_ICD_FILENAMES={icd}"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            env=env,
            timeout=PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return False, f"the SAPIEN render probe did not finish in {PROBE_TIMEOUT_S} s"
    if "RENDER_OK" in proc.stdout:
        return True, f"SAPIEN renders with VK_ICD_FILENAMES={icd}"
    lines = [
        line for line in (proc.stderr or proc.stdout).splitlines() if line.strip() and "Warn" not in line
    ]
    return False, f"SAPIEN cannot render with VK_ICD_FILENAMES={icd}: {lines[-1] if lines else 'no output'}"


def physics_status() -> tuple[bool, str]:
    """(True, version) when a physics-only SAPIEN scene steps here, else (False, why not)."""
    try:
        sapien = import_sapien()
        scene = sapien.Scene([sapien.physx.PhysxCpuSystem()])
        builder = scene.create_actor_builder()
        builder.add_box_collision(half_size=[0.1, 0.1, 0.1])
        actor = builder.build()
        scene.step()
        z = float(actor.pose.p[2])
    except Exception as err:  # any failure means "physics unavailable", reported as text
        return False, f"SAPIEN physics unavailable: {err}"
    if z >= 0:
        return False, "SAPIEN physics stepped but gravity did not act"
    return True, f"SAPIEN {sapien.__version__} physics (PhysX CPU)"
