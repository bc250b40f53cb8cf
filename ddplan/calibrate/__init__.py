"""Measurements on real hardware and the torch reference model; the only place ddplan imports torch.

Importing this package imports nothing heavy: each module (`ddplan.calibrate.reference`, ...) imports
torch itself, and only the `calibrate` command and the tests import those modules.
"""
