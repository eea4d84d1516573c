"""The run tables now live with the other reports (elasticbench/report/run_table.py)."""

from ..report.run_table import render_run

__all__ = ["render_run"]
