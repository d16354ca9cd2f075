"""SAPIEN simulator throughput: physics episodes/s per worker and through the pool, rendered frames/s.

    .venv/bin/python benchmarks/sim.py [--episodes 120] [--workers 2] [--frames 20] [--assets 60]

Episodes are full oracle pull episodes, the expensive case (most random actions miss the object and return
after the raycast): procedural objects under the simple protocol (scene build + raycast + 190 physics
steps), and generated PartNet-Mobility-format objects under the manipllm protocol (URDF + OBJ meshes loaded,
gravity, 260 steps with the hand's collision boxes), whose ManipLLM-style sampling (settling, affordance
search, demonstration) is timed too, as is loading them with each collision mode. Also saves a rendered
example with the oracle contact marked under <cache>/examples/ where rendering works. Target: >= 30 physics
episodes/s per core.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from PIL import Image, ImageDraw

from vlm_grpoma.cache import cache_dir
from vlm_grpoma.envs.sapien.camera import render
from vlm_grpoma.envs.sapien.manipllm import sample_asset_episode
from vlm_grpoma.envs.sapien.partnet import scan_assets
from vlm_grpoma.envs.sapien.partnet_export import generate_assets
from vlm_grpoma.envs.sapien.pool import SimPool
from vlm_grpoma.envs.sapien.protocol import MANIPLLM
from vlm_grpoma.envs.sapien.scene import build_urdf_scene
from vlm_grpoma.envs.sapien.task import execute, prepare, sample_split_episode
from vlm_grpoma.envs.sapien.urdf import COLLISION_MODES
from vlm_grpoma.envs.sapien.vulkan import rendering_status
from vlm_grpoma.eval.manipulation import random_action


def episodes(n: int, size: int = 336) -> list:
    return [
        sample_split_episode("seen" if i % 2 else "unseen", i, 0, width=size, height=size) for i in range(n)
    ]


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:8.1f}/s ({count} in {seconds:.2f} s)"


def bench_physics(eps: list, label: str = "") -> None:
    start, cpu = time.perf_counter(), time.process_time()
    outcomes = [execute(spec, oracle) for spec, oracle in eps]
    print(
        f"physics{label}, 1 worker, oracle episodes : {rate(len(eps), time.perf_counter() - start)}; "
        f"success {sum(o.success for o in outcomes)}/{len(eps)}; "
        f"{len(eps) / (time.process_time() - cpu):.1f}/s per CPU-second"
    )
    start = time.perf_counter()
    outcomes = [execute(spec, random_action(spec, 0, i)) for i, (spec, _) in enumerate(eps)]
    print(
        f"physics{label}, 1 worker, random actions  : {rate(len(eps), time.perf_counter() - start)}; "
        f"success {sum(o.success for o in outcomes)}/{len(eps)}"
    )


def bench_assets(count: int) -> None:
    """The manipllm protocol on generated PartNet-Mobility-format objects, and the collision modes' cost."""
    with tempfile.TemporaryDirectory() as root:
        generate_assets(root, max(1, count // 12), seed=0)
        assets = scan_assets(root)
        start, cpu = time.perf_counter(), time.process_time()
        eps = []
        for i in range(count):
            try:
                eps.append(sample_asset_episode(assets[i % len(assets)], i))
            except RuntimeError:
                pass
        print(
            f"manipllm sampling (settle, affordance, demonstration): {rate(len(eps), time.perf_counter() - start)};"
            f" {len(eps) / (time.process_time() - cpu):.1f}/s per CPU-second; {count - len(eps)} dropped"
        )
        bench_physics(eps, " (manipllm, PartNet-format)")
        for mode in COLLISION_MODES:
            if mode == "coacd" and __import__("importlib").util.find_spec("coacd") is None:
                print("collision coacd: not measured (the coacd package is not installed)")
                continue
            start = time.perf_counter()
            shapes = 0
            for spec, _ in eps:
                built = build_urdf_scene(Path(spec.urdf), protocol=MANIPLLM, scale=spec.scale, collision=mode)
                shapes += sum(len(c.collision_shapes) for c in built.link_components.values())
                for _ in range(260):
                    built.scene.step()
            print(
                f"collision {mode:7s}: load + 260 steps {1000 * (time.perf_counter() - start) / len(eps):.1f} ms "
                f"per object, {shapes / len(eps):.1f} convex shapes per object"
            )


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of processes (Linux /proc; 0 elsewhere)."""
    total = 0.0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def bench_pool(eps: list, workers: int) -> None:
    with SimPool(workers) as pool:
        pool.execute(eps[: workers * 2])  # start-up and imports are not measured
        pids = pool.worker_pids()
        start, cpu = time.perf_counter(), cpu_seconds(pids)
        outcomes = pool.execute(eps)
        wall, used = time.perf_counter() - start, cpu_seconds(pids) - cpu
        per_cpu = f"; {len(eps) / used:.1f}/s per worker CPU-second" if used > 0 else ""
        print(
            f"physics, pool of {workers}, oracle episodes: {rate(len(eps), wall)}; "
            f"success {sum(o.success for o in outcomes)}/{len(eps)}{per_cpu}"
        )


def bench_render(frames: int) -> None:
    ok, reason = rendering_status(in_process=True)
    if not ok:
        print(f"rendering: unavailable ({reason})")
        return
    eps = episodes(frames, size=448)
    start = time.perf_counter()
    views = render(prepare(eps[0][0], render=True), eps[0][0].camera)
    print(f"rendering, first frame in process  : {time.perf_counter() - start:.2f} s (pipeline build)")
    scenes = [(prepare(spec, render=True), spec) for spec, _ in eps]
    start = time.perf_counter()
    for built, spec in scenes:
        render(built, spec.camera)
    print(f"rendering 448x448 RGB+pos+seg      : {rate(frames, time.perf_counter() - start)}")
    spec, oracle = eps[0]
    views = render(prepare(spec, render=True), spec.camera)
    image = Image.fromarray(views.rgb)
    x, y = oracle.point
    ImageDraw.Draw(image).ellipse([x - 6, y - 6, x + 6, y + 6], outline=(0, 220, 0), width=3)
    out = cache_dir() / "examples" / f"sapien_{spec.category}_448.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out)
    print(f"example render ({spec.category}, oracle contact in green): {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=120)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--assets", type=int, default=60, help="manipllm episodes on generated assets")
    args = parser.parse_args()
    print(
        f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (other processes slow the pool)"
    )
    start = time.perf_counter()
    eps = episodes(args.episodes)
    print(f"sampling episodes (camera search)  : {rate(len(eps), time.perf_counter() - start)}")
    bench_physics(eps)
    bench_pool(eps, args.workers)
    bench_assets(args.assets)
    bench_render(args.frames)


if __name__ == "__main__":
    main()
