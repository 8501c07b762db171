"""What a run keeps of its model in storage: sharded, committed, verifiable DCP checkpoints with their lineage and
retention (``dcp``), a user's script's own checkpoint files committed the same way (``script_files``), when to try a
failed save again (``save_retries``), and model weights as safetensors files (``safetensors_file``).

May import: the base modules at the package's root and ``spotray.accounts``."""
