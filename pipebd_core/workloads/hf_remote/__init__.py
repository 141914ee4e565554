"""The modeling code of a heterogeneous network's Hugging Face directory, copied verbatim into it.

`configuration_pipebd.py` and `modeling_pipebd.py` are the remote code (`auto_map`) of every directory
PipeBD writes for a network whose layers differ (workloads/hf_directory.py): self-contained, they import
torch and transformers only (and each other, relatively, as remote code must), so the directory loads
with `trust_remote_code=True` where PipeBD is not installed. Their `VERSION` is written into config.json.
"""
