"""Trials served from a recorded response surface instead of run: the surface and its runner, and a machine whose
load comes and goes for replayed sessions."""
