"""`rstar2 doctor`: what this machine (or image) has, one line per check.

:mod:`rstar2.doctor.versions` (standard library only) also writes an image's versions.json.
"""
