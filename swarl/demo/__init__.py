"""`swarl demo`: the local CPU run (run.py), its warm start (warmstart.py), the statistics of a
learning measurement (stats.py) and the summary across seeds (report.py)."""
