"""The only door to a run directory: the run record (result.json), the curves (metrics.csv), checkpoints and
model.pt, and the layout of run, agent and sweep dirs."""
