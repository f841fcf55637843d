"""A stand-in for unsloth_zoo (not installed in CI): only the TiledMLP module, with unsloth_zoo's call signature."""
