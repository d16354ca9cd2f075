"""SAPIEN 3 manipulation: procedural articulated objects, cameras, suction gripper, worker pool."""
