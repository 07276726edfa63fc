"""Uncertainty maths shared by methods (evidential / Dirichlet, MC-dropout)."""
