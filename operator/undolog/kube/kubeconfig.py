"""Who this process is to the API, and where the API is: a kubeconfig as kubectl reads it, or
the Pod's service account.

Supported as kubectl does: KUBECONFIG with several files (the first to name a cluster, user or
context wins), paths relative to the file that holds them, certificate and key files or data,
tokens and token files (re-read, as kubelet rotates them), exec credential plugins (run again
when what they gave expires; their stderr reaches the terminal, and their stdin it too when it is
one and `interactiveMode` allows, so a login prompt works; `provideClusterInfo`), impersonation
(as, as-groups, as-uid, as-user-extra), insecure-skip-tls-verify and tls-server-name. What is
not (auth-provider, basic auth, proxy-url) is refused with the field named, never ignored.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from undolog import errors
from undolog.tls import load_certificate_chain

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_FILE_REREAD_SECONDS = 60.0  # as client-go: a rotated projected token is picked up within a minute
EXEC_EARLY_SECONDS = 10.0  # run the plugin again a little before what it gave expires
EXEC_TIMEOUT_SECONDS = 60.0  # a plugin that hangs (a browser login nobody completes) is an error
UNSUPPORTED_USER_FIELDS = ("auth-provider", "username", "password")
EXEC_EXTENSION = (
    "client.authentication.k8s.io/exec"  # a cluster's extension passed to its plugin as spec.cluster.config
)
STDERR_KEPT = 500  # of a plugin's stderr, quoted when it fails


@dataclass(frozen=True)
class ExecPlugin:
    """A client-go credential plugin: a command that prints an ExecCredential."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = "client.authentication.k8s.io/v1"
    base_dir: str = "."  # a relative command is found from the kubeconfig's folder, as kubectl does
    interactive_mode: str = "IfAvailable"  # Never, IfAvailable, Always (client-go's)
    cluster: dict[str, Any] | None = None  # spec.cluster, with provideClusterInfo: true
    install_hint: str = ""


@dataclass(frozen=True)
class ExecCredential:
    """What a plugin printed."""

    token: str | None
    certificate_data: bytes | None
    key_data: bytes | None
    expires: float | None  # time.time() after which it must be run again


@dataclass(frozen=True)
class Credentials:
    """Everything needed to reach the API as one user."""

    server: str
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    certificate_file: str | None = None
    key_file: str | None = None
    certificate_data: bytes | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    exec_plugin: ExecPlugin | None = None
    as_user: str | None = None
    as_groups: tuple[str, ...] = ()
    as_uid: str | None = None
    as_extra: tuple[tuple[str, str], ...] = ()  # Impersonate-Extra-<key>: value, one per value
    namespace: str = "default"
    source: str = ""  # the file (or "the service account") these came from, for error messages


def kubeconfig_paths(kubeconfig: str | None = None) -> list[Path]:
    if kubeconfig:
        return [Path(kubeconfig).expanduser()]
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return [Path(p).expanduser() for p in listed] or [Path("~/.kube/config").expanduser()]


def in_cluster(kubeconfig: str | None = None) -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not (kubeconfig or os.environ.get("KUBECONFIG"))


def service_account() -> Credentials:
    """The Pod's own identity: its projected token (re-read as it rotates) and the cluster CA."""
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    try:
        namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip()
    except OSError:
        namespace = "default"
    return Credentials(
        server=f"https://{host}:{port}",
        ca_file=str(SERVICE_ACCOUNT / "ca.crt"),
        token_file=str(SERVICE_ACCOUNT / "token"),
        namespace=namespace or "default",
        source="the Pod's service account",
    )


@dataclass
class _Merged:
    """KUBECONFIG's files merged as kubectl merges them; each entry remembers its file."""

    clusters: dict[str, tuple[dict[str, Any], Path]] = field(default_factory=dict)
    users: dict[str, tuple[dict[str, Any], Path]] = field(default_factory=dict)
    contexts: dict[str, dict[str, Any]] = field(default_factory=dict)
    current: str | None = None
    sources: list[Path] = field(default_factory=list)
    tried: list[Path] = field(default_factory=list)  # every path looked at, found or not


def _read(paths: Sequence[Path]) -> _Merged:
    merged = _Merged(tried=list(paths))
    for path in paths:
        try:
            document = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            continue
        except (OSError, yaml.YAMLError) as error:
            raise errors.KubeconfigInvalid(f"the kubeconfig {path} cannot be read: {error}") from error
        if not isinstance(document, dict):
            raise errors.KubeconfigInvalid(f"the kubeconfig {path} is not a mapping")
        merged.sources.append(path)
        for key, into in (("clusters", merged.clusters), ("users", merged.users)):
            for named in document.get(key) or []:
                body = named.get(key[:-1]) or {}
                into.setdefault(str(named.get("name")), (body, path))
        for named in document.get("contexts") or []:
            merged.contexts.setdefault(str(named.get("name")), named.get("context") or {})
        merged.current = merged.current or document.get("current-context") or None
    return merged


def _context(merged: _Merged, context: str | None) -> tuple[str, dict[str, Any]]:
    where = ", ".join(map(str, merged.sources)) or " or ".join(map(str, merged.tried))
    if not merged.sources:
        raise errors.KubeconfigInvalid(
            f"no kubeconfig found at {where}: set KUBECONFIG or --kubeconfig, or run in a Pod"
        )
    name = context or merged.current
    if not name:
        raise errors.KubeconfigInvalid(f"the kubeconfig {where} sets no current-context: pass --context")
    if name not in merged.contexts:
        known = ", ".join(sorted(merged.contexts)) or "none"
        raise errors.KubeconfigInvalid(f"the kubeconfig {where} has no context {name!r} (it has: {known})")
    return name, merged.contexts[name]


def default_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The context's namespace, or the in-cluster one, or "default"."""
    if in_cluster(kubeconfig) and context is None:
        return service_account().namespace
    try:
        _, chosen = _context(_read(kubeconfig_paths(kubeconfig)), context)
    except errors.KubeconfigInvalid:  # no kubeconfig, or one that cannot be read: the API's default
        return "default"
    return str(chosen.get("namespace") or "default")


def _relative(path: str | None, base: Path) -> str | None:
    return None if path is None else str(base.parent / Path(path).expanduser())


def _data(value: str | None, what: str, source: Path) -> bytes | None:
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as error:
        raise errors.KubeconfigInvalid(f"the kubeconfig {source}: {what} is not base64 ({error})") from error


def from_kubeconfig(kubeconfig: str | None = None, context: str | None = None) -> Credentials:
    merged = _read(kubeconfig_paths(kubeconfig))
    name, chosen = _context(merged, context)
    cluster_name, user_name = str(chosen.get("cluster")), str(chosen.get("user", ""))
    if cluster_name not in merged.clusters:
        raise errors.KubeconfigInvalid(f"the kubeconfig context {name!r} names cluster {cluster_name!r}, not defined")
    cluster, cluster_file = merged.clusters[cluster_name]
    user, user_file = merged.users.get(user_name, ({}, cluster_file))
    where = f"the kubeconfig {user_file}, user {user_name!r}"
    for unsupported in UNSUPPORTED_USER_FIELDS:
        if user.get(unsupported):
            raise errors.KubeconfigInvalid(
                f"{where} uses {unsupported}, which UndoLog does not support: use a client certificate, a token "
                "or an exec credential plugin (as current cloud CLIs install)"
            )
    if cluster.get("proxy-url"):
        raise errors.KubeconfigInvalid(
            f"the kubeconfig {cluster_file}, cluster {cluster_name!r} sets proxy-url, which UndoLog does not support"
        )
    if not cluster.get("server"):
        raise errors.KubeconfigInvalid(f"the kubeconfig {cluster_file}, cluster {cluster_name!r} has no server")
    return Credentials(
        server=str(cluster["server"]).rstrip("/"),
        ca_file=_relative(cluster.get("certificate-authority"), cluster_file),
        ca_data=_data(cluster.get("certificate-authority-data"), "certificate-authority-data", cluster_file),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=cluster.get("tls-server-name"),
        certificate_file=_relative(user.get("client-certificate"), user_file),
        key_file=_relative(user.get("client-key"), user_file),
        certificate_data=_data(user.get("client-certificate-data"), "client-certificate-data", user_file),
        key_data=_data(user.get("client-key-data"), "client-key-data", user_file),
        token=user.get("token"),
        token_file=_relative(user.get("tokenFile"), user_file),
        exec_plugin=_exec_plugin(user.get("exec"), user_file, cluster, cluster_file),
        as_user=user.get("as"),
        as_groups=tuple(user.get("as-groups") or ()),
        as_uid=user.get("as-uid"),
        as_extra=tuple((str(k), str(v)) for k, values in (user.get("as-user-extra") or {}).items() for v in values),
        namespace=str(chosen.get("namespace") or "default"),
        source=str(user_file),
    )


def _exec_plugin(
    plugin: dict[str, Any] | None, user_file: Path, cluster: dict[str, Any], cluster_file: Path
) -> ExecPlugin | None:
    if not plugin:
        return None
    mode = str(plugin.get("interactiveMode") or "IfAvailable")
    if mode not in ("Never", "IfAvailable", "Always"):
        raise errors.KubeconfigInvalid(
            f"the kubeconfig {user_file}: exec.interactiveMode is {mode!r}, not Never, IfAvailable or Always"
        )
    return ExecPlugin(
        command=str(plugin["command"]),
        args=tuple(str(a) for a in plugin.get("args") or ()),
        env=tuple((str(e["name"]), str(e["value"])) for e in plugin.get("env") or ()),
        api_version=str(plugin.get("apiVersion", ExecPlugin.api_version)),
        base_dir=str(user_file.parent),
        interactive_mode=mode,
        cluster=_cluster_info(cluster, cluster_file) if plugin.get("provideClusterInfo") else None,
        install_hint=str(plugin.get("installHint") or ""),
    )


def _cluster_info(cluster: dict[str, Any], cluster_file: Path) -> dict[str, Any]:
    """ExecCredential's spec.cluster, as client-go fills it (the CA as data, read from its file)."""
    ca = cluster.get("certificate-authority-data")
    if ca is None and cluster.get("certificate-authority"):
        path = Path(_relative(cluster["certificate-authority"], cluster_file) or "")
        ca = base64.b64encode(path.read_bytes()).decode() if path.is_file() else None
    info = {
        "server": cluster.get("server"),
        "tls-server-name": cluster.get("tls-server-name"),
        "insecure-skip-tls-verify": cluster.get("insecure-skip-tls-verify"),
        "certificate-authority-data": ca,
        "config": next(
            (e.get("extension") for e in cluster.get("extensions") or [] if e.get("name") == EXEC_EXTENSION), None
        ),
    }
    return {key: value for key, value in info.items() if value is not None}


def credentials(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    as_user: str | None = None,
    as_groups: Sequence[str] = (),
) -> Credentials:
    """From the given kubeconfig (or KUBECONFIG), else the in-cluster service account;
    `as_user`/`as_groups` impersonate as kubectl's --as/--as-group do (they replace the
    kubeconfig's own as/as-groups)."""
    found = service_account() if in_cluster(kubeconfig) and context is None else from_kubeconfig(kubeconfig, context)
    if as_user or as_groups:
        found = replace(found, as_user=as_user, as_groups=tuple(as_groups))
    return found


def run_exec_plugin(plugin: ExecPlugin) -> ExecCredential:
    """Run the plugin as client-go does: its stderr relayed to ours as it comes (a login prompt is
    seen), stdin ours when it is a terminal and interactiveMode allows (`interactive` told)."""
    interactive = plugin.interactive_mode != "Never" and sys.stdin is not None and sys.stdin.isatty()
    if plugin.interactive_mode == "Always" and not interactive:
        raise errors.KubeconfigInvalid(
            f"the exec credential plugin {plugin.command!r} needs a terminal (interactiveMode: Always), "
            "and stdin is not one"
        )
    spec: dict[str, Any] = {"interactive": interactive}
    if plugin.cluster is not None:
        spec["cluster"] = plugin.cluster
    info = {"apiVersion": plugin.api_version, "kind": "ExecCredential", "spec": spec}
    command = plugin.command
    if os.sep in command and not os.path.isabs(command):
        command = os.path.join(plugin.base_dir, command)
    env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
    # No time limit on a person at a prompt; one on a plugin nobody can answer.
    timeout = None if interactive else EXEC_TIMEOUT_SECONDS
    try:
        done = _run_relaying_stderr([command, *plugin.args], env, interactive, timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        hint = f" ({plugin.install_hint.strip()})" if plugin.install_hint and isinstance(error, OSError) else ""
        raise errors.KubeconfigInvalid(
            f"the exec credential plugin {plugin.command!r} could not run: {error}{hint}"
        ) from error
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[-STDERR_KEPT:]
        raise errors.KubeconfigInvalid(
            f"the exec credential plugin {plugin.command!r} exited with {done.returncode}: {said}"
        )
    try:
        status = json.loads(done.stdout)["status"]
        expires = status.get("expirationTimestamp")
        certificate, key = status.get("clientCertificateData"), status.get("clientKeyData")
        return ExecCredential(
            token=status.get("token"),
            certificate_data=certificate.encode() if certificate else None,
            key_data=key.encode() if key else None,
            expires=datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp() if expires else None,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise errors.KubeconfigInvalid(
            f"the exec credential plugin {plugin.command!r} printed no ExecCredential status: {error}"
        ) from error


def _run_relaying_stderr(
    argv: list[str], env: dict[str, str], interactive: bool, timeout: float | None
) -> subprocess.CompletedProcess[bytes]:
    """The plugin run to its end: stdout kept, stderr copied to ours line by line (and its end
    kept for the error message)."""
    process = subprocess.Popen(
        argv, env=env, stdin=None if interactive else subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None
    assert process.stderr is not None
    kept = bytearray()

    def relay(stream: Any) -> None:
        for line in iter(stream.readline, b""):
            kept.extend(line)
            del kept[: max(0, len(kept) - 4 * STDERR_KEPT)]
            sys.stderr.write(line.decode(errors="replace"))
            sys.stderr.flush()

    out = bytearray()
    stdout = process.stdout
    readers = [
        threading.Thread(target=relay, args=(process.stderr,), daemon=True),
        threading.Thread(target=lambda: out.extend(stdout.read()), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    finally:
        for reader in readers:
            reader.join(5)
    return subprocess.CompletedProcess(argv, process.returncode, bytes(out), bytes(kept))


def ssl_context(found: Credentials, issued: ExecCredential | None = None) -> ssl.SSLContext:
    """Trust the cluster's CA (or the system's), present the client certificate if there is one."""
    if found.insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(
            cafile=found.ca_file, cadata=found.ca_data.decode() if found.ca_data else None
        )
    certificate = (issued.certificate_data if issued else None) or found.certificate_data
    key = (issued.key_data if issued else None) or found.key_data
    if certificate and key:
        load_certificate_chain(context, certificate, key)
    elif found.certificate_file and found.key_file:
        context.load_cert_chain(found.certificate_file, found.key_file)
    return context


@dataclass
class TokenSource:
    """The bearer token for the next request: fixed, from a file re-read each minute, or from an
    exec plugin run again when it expires. One refresh at a time, shared by every request that
    finds the credential stale (a plugin that takes a second ran once per request before)."""

    found: Credentials
    generation: int = 0  # bumped by each read or issue: a refusal of an older one is answered
    _token: str | None = None
    _read_at: float = float("-inf")
    _issued: ExecCredential | None = None
    _refreshing: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._token = self.found.token

    async def issued(self) -> ExecCredential | None:
        """What the exec plugin gave, run again (in a thread: it may take seconds) when expired;
        None without a plugin."""
        plugin = self.found.exec_plugin
        if plugin is None:
            return None
        if self._plugin_stale():
            await self._refresh(plugin)
        return self._issued

    def forget(self, refused: int | None = None) -> None:
        """The API refused the credentials of generation `refused` (401; None: whichever are
        current): read or issue them again before the next request, unless that was done since."""
        if refused is None or refused == self.generation:
            self._issued, self._read_at = None, float("-inf")

    async def token(self) -> str | None:
        issued = await self.issued()
        if issued is not None and issued.token:
            return issued.token
        if self.found.token_file and time.monotonic() - self._read_at >= TOKEN_FILE_REREAD_SECONDS:
            await self._refresh(None)
        return self._token

    def _plugin_stale(self) -> bool:
        return self._issued is None or (
            self._issued.expires is not None and time.time() >= self._issued.expires - EXEC_EARLY_SECONDS
        )

    async def _refresh(self, plugin: ExecPlugin | None) -> None:
        """Run the plugin or read the token file, or wait for the refresh already running: its
        failure is every waiter's (a plugin that fails is run again by the next request only)."""
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._read_or_issue(plugin))
        running = self._refreshing
        try:
            await asyncio.shield(running)
        finally:
            if self._refreshing is running and running.done():
                self._refreshing = None

    async def _read_or_issue(self, plugin: ExecPlugin | None) -> None:
        if plugin is not None:
            self._issued = await asyncio.to_thread(run_exec_plugin, plugin)
        else:
            path = str(self.found.token_file)
            try:
                self._token = (await asyncio.to_thread(Path(path).read_text)).strip()
            except OSError as error:
                raise errors.KubeconfigInvalid(
                    f"the token file {path} ({self.found.source}) cannot be read: {error}"
                ) from error
            self._read_at = time.monotonic()
        self.generation += 1
