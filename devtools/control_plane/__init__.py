"""A real local Kubernetes control plane for the demo and the tests (no kind, no Docker)."""

from devtools.control_plane.local import ControlPlaneError, Endpoints, LocalControlPlane

__all__ = ["ControlPlaneError", "Endpoints", "LocalControlPlane"]
