"""Probe inputs for sink measurement: natural text windows, random tokens, a repeated token, user text."""

from sinklab.probe.inputs import INPUTS, Probe, bos_tokens, make_probe

__all__ = ["INPUTS", "Probe", "bos_tokens", "make_probe"]
