"""Nstance: a cloud-agnostic VM auto-scaler control plane.

The package holds four programs (server, agent, operator, admin) and the layers they share.
See DESIGN.md in the shared folder for the layering; this module only carries the version.
"""

__version__ = "0.1.0"
