"""Figures made from report.json (server side) and site-local overlays (site side)."""
