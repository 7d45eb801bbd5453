"""Patches of third-party frameworks (:mod:`.hooks`: PyTorch FSDP1/FSDP2, vLLM, Megatron-Core,
verl) that label their memory for the decompose analysis or take snapshots at their key points,
with the table of supported versions and the helpers that apply, label and restore them.

May import: :mod:`msmemscope.capture` (``owners``, through ``hooks/_label.py``, once torch is
imported), :mod:`msmemscope.snapshot` (SNAPSHOT rows and CUDA pickles around calls) and the
bottom modules (``msmemscope._import_hook``: the automatic hooks wait for their framework's
import). Not :mod:`msmemscope.watch` (no hook uses it) nor the package's public modules.
Nothing below imports this folder: the tracker turns the automatic decompose hooks on and off
through ``msmemscope.capture.extensions``.
"""
