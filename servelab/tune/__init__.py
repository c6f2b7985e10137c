"""Configuration search: on the simulator first, then confirmed on real servers."""
