"""SAPIEN 3 manipulation: procedural articulated objects, cameras, suction gripper, worker pool.

Modules, in data-flow order:

- ``objects``  seeded category generators (pure data), splits (seen/unseen categories, held-out seeds);
- ``urdf``     emit an object as URDF, load any URDF (PartNet-Mobility ``mobility.urdf``) into a scene;
- ``vulkan``   point SAPIEN at the project's Mesa lavapipe; physics/rendering status probes;
- ``scene``    build a physics-only (or rendering) scene holding one object;
- ``camera``   ManipLLM-like viewpoints, pinhole projection, raycasts, rendering;
- ``gripper``  the floating suction gripper;
- ``task``     episode specs (the record ``meta``), the oracle, executing a ContactAction, success rule;
- ``pool``     process pool of simulator workers with crash isolation.
"""
