"""SAPIEN 3 manipulation: procedural and PartNet-Mobility objects, cameras, suction gripper, worker pool.

Modules, in data-flow order:

- ``objects``        seeded category generators (pure data), splits (seen/unseen categories, held-out seeds);
- ``partnet``        read and validate PartNet-Mobility folders (mobility.urdf, meta, semantics, mobility_v2);
- ``partnet_export`` write procedural objects as PartNet-Mobility folders (``vlm-grpoma make-assets``);
- ``splits``         seen/unseen category split files (ManipLLM's shipped), train/test by instance;
- ``urdf``           emit an object as URDF, load any URDF into a scene (collision modes, missing collisions);
- ``vulkan``         point SAPIEN at the project's Mesa lavapipe; physics/rendering status probes;
- ``protocol``       execution protocols: ``simple`` and ``manipllm``;
- ``scene``          build a physics-only (or rendering) scene holding one object;
- ``camera``         ManipLLM's viewpoints, pinhole projection, raycasts, rendering;
- ``gripper``        the floating suction gripper (optionally with the Panda hand's collision boxes);
- ``success``        the success rule as pure functions;
- ``task``           episode specs (the record ``meta``), the oracle, executing a ContactAction;
- ``manipllm``       episodes sampled as ManipLLM collects them (state, settling, affordance, demonstration);
- ``pool``           process pool of simulator workers with crash isolation.
"""
