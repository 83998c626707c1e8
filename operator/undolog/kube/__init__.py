"""The Kubernetes adapter: the only code that speaks HTTP to the API (its own JSON client,
and kopf) or reads a kubeconfig. It speaks plain JSON bodies; `undolog.ledger` parses them
into the typed API models once, at this edge."""

from undolog.api.common import Plural
from undolog.kube.client import TIMEOUTS, Body, EventRecord, Kube, Timeouts, as_kube_error
from undolog.kube.kubeconfig import default_namespace

__all__ = ["TIMEOUTS", "Body", "EventRecord", "Kube", "Plural", "Timeouts", "as_kube_error", "default_namespace"]
