"""TLS and bearer tokens for every isthmus gRPC server and client.

    srv = ServerSecurity.from_files(cert="server.pem", key="server.key",
                                    client_ca="clients-ca.pem",      # optional: require client certs
                                    token_file="token.txt")          # optional: bearer token on every call
    cli = ClientSecurity.from_files(ca="ca.pem", cert="client.pem", key="client.key", token_file="token.txt")
    channel = make_channel("host:port", cli)

Local use needs none of it: `security=None` (the default everywhere) is a plaintext server
bound to 127.0.0.1. For anything reachable from another machine, turn TLS and the token on
(docs/security.md). The same settings come from the environment, so a whole cluster started
by `isthmus server` or LocalCluster picks them up:

    ISTHMUS_TLS_CERT / ISTHMUS_TLS_KEY     server certificate chain and key (PEM files)
    ISTHMUS_TLS_CLIENT_CA                  CA that client certificates must chain to (mutual TLS)
    ISTHMUS_TLS_CA                         CA a client checks servers against
    ISTHMUS_TLS_CLIENT_CERT / _KEY         a client's own certificate and key (mutual TLS)
    ISTHMUS_TOKEN_FILE (or ISTHMUS_TOKEN)  the cluster token (every call)
    ISTHMUS_CLIENT_TOKEN_FILE (or _TOKEN)  optional client token (run graphs, read fetches only)

Tokens have roles. The cluster token may make every call. A client token, when the server
has one, may only call CLIENT_METHODS (the master's session calls, the offload service):
a graph it creates must not write variables or touch the rendezvous (the master checks,
cloud/master.py), and the cluster-internal calls (RegisterGraph, RunGraph, RecvTensor,
DeregisterGraph, GetStatus, ...) end PERMISSION_DENIED. `caller_role()` tells a handler
which role the call came with.

The token travels as `authorization: Bearer <token>` metadata and is compared in constant
time. A call without it, or with another, ends UNAUTHENTICATED before any handler runs;
the standard health check (grpc.health.v1.Health) is exempt so probes work without
secrets. A plaintext client talking to a TLS port fails the handshake: UNAVAILABLE.

This module lives in wire/, the leaf package that cloud/ (servers, task-to-task clients) and edge/
(the offload client) both import: both open channels. grpc is imported lazily, when a channel or
server credentials are made.
"""
from __future__ import annotations

import hmac
import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

TOKEN_METADATA = "authorization"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
MAX_PEM_BYTES = 1 << 20
MAX_TOKEN_CHARS = 4096
CLUSTER, CLIENT = "cluster", "client"
# the calls a client token may make; everything else needs the cluster token
CLIENT_METHODS = frozenset([f"/isthmus.Master/{m}" for m in (
    "CreateSession", "ExtendSession", "RunStep", "CloseSession", "ListDevices")]
    + [f"/isthmus.Offload/{m}" for m in ("Describe", "Infer", "Stats")])
_ROLE = threading.local()


def caller_role() -> str:
    """The role of the call this thread is serving: CLIENT for a client token, else CLUSTER
    (the cluster token, or a server without tokens: a loopback-only one)."""
    return getattr(_ROLE, "role", CLUSTER)


class SecurityError(ValueError):
    """A TLS or token setting is unusable (the message names the file or variable)."""


def _read(path: Optional[str], what: str) -> Optional[bytes]:
    if path is None or path == "":
        return None
    try:
        size = os.path.getsize(path)
        if size > MAX_PEM_BYTES:
            raise SecurityError(f"{what} {path!r} is {size} bytes; a PEM file here is at most {MAX_PEM_BYTES}")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SecurityError(f"cannot read {what} {path!r}: {e.strerror or e}") from None
    if b"-----BEGIN " not in data:
        raise SecurityError(f"{what} {path!r} is not PEM (no '-----BEGIN' line)")
    return data


def _check_token(token: Optional[str], where: str) -> Optional[str]:
    if token is None:
        return None
    token = token.strip()
    if not token:
        raise SecurityError(f"{where}: the token is empty")
    if len(token) > MAX_TOKEN_CHARS:
        raise SecurityError(f"{where}: the token is longer than {MAX_TOKEN_CHARS} characters")
    if not all(33 <= ord(c) < 127 for c in token):
        raise SecurityError(f"{where}: the token must be printable ASCII without spaces")
    return token


def read_token(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    try:
        if os.path.getsize(path) > MAX_TOKEN_CHARS + 2:
            raise SecurityError(f"token file {path!r} is longer than {MAX_TOKEN_CHARS} characters")
        with open(path, encoding="ascii", errors="strict") as f:
            return _check_token(f.read(), f"token file {path!r}")
    except OSError as e:
        raise SecurityError(f"cannot read token file {path!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise SecurityError(f"token file {path!r} is not ASCII") from None


def _env_token(env: Mapping[str, str], prefix: str = "ISTHMUS_") -> Optional[str]:
    if env.get(prefix + "TOKEN_FILE"):
        return read_token(env[prefix + "TOKEN_FILE"])
    var = prefix + "TOKEN"
    return _check_token(env.get(var), "$" + var) if env.get(var) else None


@dataclass(frozen=True)
class ServerSecurity:
    cert_chain: Optional[bytes] = None
    private_key: Optional[bytes] = None
    client_ca: Optional[bytes] = None   # set: every client must present a certificate signed by it
    token: Optional[str] = None         # the cluster token: every call
    client_token: Optional[str] = None  # a client's: CLIENT_METHODS only, graphs that write nothing

    def __post_init__(self):
        if (self.cert_chain is None) != (self.private_key is None):
            raise SecurityError("TLS needs both a certificate chain and its private key")
        if self.client_ca is not None and self.cert_chain is None:
            raise SecurityError("client certificates (a client CA) need TLS: give a server certificate and key")
        object.__setattr__(self, "token", _check_token(self.token, "server token"))
        object.__setattr__(self, "client_token", _check_token(self.client_token, "client token"))
        if self.client_token is not None and (self.token is None or self.client_token == self.token):
            raise SecurityError("a client token needs a cluster token (--token-file) that differs from it")

    @property
    def exposable(self) -> bool:
        """TLS and a token: the only settings under which a server listens beyond loopback
        without --insecure."""
        return self.tls and self.token is not None

    @property
    def tls(self) -> bool:
        return self.cert_chain is not None

    @classmethod
    def from_files(cls, cert: Optional[str] = None, key: Optional[str] = None, client_ca: Optional[str] = None,
                   token_file: Optional[str] = None, token: Optional[str] = None,
                   client_token_file: Optional[str] = None, client_token: Optional[str] = None) -> "ServerSecurity":
        if bool(cert) != bool(key):
            raise SecurityError("give both --tls-cert and --tls-key (or neither)")
        return cls(_read(cert, "TLS certificate"), _read(key, "TLS key"), _read(client_ca, "client CA"),
                   read_token(token_file) if token_file else token,
                   read_token(client_token_file) if client_token_file else client_token)

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> Optional["ServerSecurity"]:
        """The settings in the environment, or None when there are none."""
        env = os.environ if env is None else env
        s = cls.from_files(env.get("ISTHMUS_TLS_CERT"), env.get("ISTHMUS_TLS_KEY"),
                           env.get("ISTHMUS_TLS_CLIENT_CA"), token=_env_token(env),
                           client_token=_env_token(env, "ISTHMUS_CLIENT_"))
        return s if (s.tls or s.token) else None

    def interceptors(self) -> list:
        return [_make_token_interceptor(self.token, self.client_token)] if self.token else []

    def add_port(self, server, address: str) -> int:
        """Bind `address` on `server` (TLS when configured); the bound port (0: failed)."""
        import grpc  # deferred: a heavy import; wire/ loads it only when credentials or a channel are made
        if not self.tls:
            return server.add_insecure_port(address)
        creds = grpc.ssl_server_credentials([(self.private_key, self.cert_chain)],
                                            root_certificates=self.client_ca,
                                            require_client_auth=self.client_ca is not None)
        return server.add_secure_port(address, creds)

    def describe(self) -> str:
        parts = ["TLS" + (" with client certificates" if self.client_ca else "") if self.tls else "plaintext"]
        if self.token:
            parts.append("bearer token")
        if self.client_token:
            parts.append("client token")
        return " + ".join(parts)


@dataclass(frozen=True)
class ClientSecurity:
    root_ca: Optional[bytes] = None       # CA to check the server against (None with tls: system roots)
    cert_chain: Optional[bytes] = None    # the client's own certificate (mutual TLS)
    private_key: Optional[bytes] = None
    token: Optional[str] = None
    tls: bool = True                      # False: plaintext (a token then goes in the clear: local use only)
    server_name: Optional[str] = None     # the name the server's certificate must carry, if not the host

    def __post_init__(self):
        if (self.cert_chain is None) != (self.private_key is None):
            raise SecurityError("a client certificate needs its private key (and the other way round)")
        if not self.tls and (self.root_ca or self.cert_chain):
            raise SecurityError("CA or client certificate given but tls=False")
        object.__setattr__(self, "token", _check_token(self.token, "client token"))

    @classmethod
    def from_files(cls, ca: Optional[str] = None, cert: Optional[str] = None, key: Optional[str] = None,
                   token_file: Optional[str] = None, token: Optional[str] = None,
                   tls: Optional[bool] = None, server_name: Optional[str] = None) -> "ClientSecurity":
        tls = bool(ca or cert) if tls is None else tls
        return cls(_read(ca, "CA certificate"), _read(cert, "client certificate"), _read(key, "client key"),
                   read_token(token_file) if token_file else token, tls, server_name)

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> Optional["ClientSecurity"]:
        """The client side of the environment's settings, or None when there are none. TLS when a
        CA or a server certificate is configured; without $ISTHMUS_TLS_CA the server certificate
        is the root (a self-signed certificate shared by the tasks of one cluster)."""
        env = os.environ if env is None else env
        tls = bool(env.get("ISTHMUS_TLS_CA") or env.get("ISTHMUS_TLS_CERT"))
        s = cls.from_files(env.get("ISTHMUS_TLS_CA") or env.get("ISTHMUS_TLS_CERT"),
                           env.get("ISTHMUS_TLS_CLIENT_CERT"), env.get("ISTHMUS_TLS_CLIENT_KEY"),
                           token=_env_token(env), tls=tls)
        return s if (s.tls or s.token) else None


def make_channel(address: str, security: Optional[ClientSecurity] = None, options: Sequence = ()):
    """A gRPC channel to `address` ("host:port"), with TLS and the token when `security` says so."""
    import grpc  # deferred: a heavy import; wire/ loads it only when credentials or a channel are made
    options = list(options)
    if security is None:
        return grpc.insecure_channel(address, options=options)
    if security.server_name:
        options.append(("grpc.ssl_target_name_override", security.server_name))
    if security.tls:
        creds = grpc.ssl_channel_credentials(security.root_ca, security.private_key, security.cert_chain)
        if security.token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(security.token))
        return grpc.secure_channel(address, creds, options=options)
    ch = grpc.insecure_channel(address, options=options)
    if security.token:
        ch = grpc.intercept_channel(ch, *_token_client_interceptors(security.token))
    return ch


def _token_client_interceptors(token: str):
    import grpc  # deferred: a heavy import; wire/ loads it only when credentials or a channel are made

    class _Details(grpc.ClientCallDetails):
        def __init__(self, d):
            self.method, self.timeout, self.credentials = d.method, d.timeout, d.credentials
            self.wait_for_ready, self.compression = getattr(d, "wait_for_ready", None), getattr(d, "compression", None)
            self.metadata = list(d.metadata or []) + [(TOKEN_METADATA, f"Bearer {token}")]

    class _Add(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
               grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
        def intercept_unary_unary(self, cont, details, request):
            return cont(_Details(details), request)

        def intercept_unary_stream(self, cont, details, request):
            return cont(_Details(details), request)

        def intercept_stream_unary(self, cont, details, it):
            return cont(_Details(details), it)

        def intercept_stream_stream(self, cont, details, it):
            return cont(_Details(details), it)

    return [_Add()]


def _role(metadata, expected: bytes, client: Optional[bytes]) -> Optional[str]:
    """CLUSTER or CLIENT for a matching bearer token, None for none or a wrong one."""
    for k, v in metadata or ():
        if k == TOKEN_METADATA:
            v = v.encode() if isinstance(v, str) else bytes(v)
            if not v.startswith(b"Bearer "):
                continue
            got = v[7:].strip()
            if hmac.compare_digest(got, expected):
                return CLUSTER
            if client is not None and hmac.compare_digest(got, client):
                return CLIENT
    return None


def _with_handler(handler, fn_of):
    """`handler` with its behaviour replaced by fn_of(old behaviour or None)."""
    import grpc  # deferred: a heavy import; wire/ loads it only when credentials or a channel are made
    kinds = (("stream_stream", grpc.stream_stream_rpc_method_handler),
             ("stream_unary", grpc.stream_unary_rpc_method_handler),
             ("unary_stream", grpc.unary_stream_rpc_method_handler),
             ("unary_unary", grpc.unary_unary_rpc_method_handler))
    for attr, make in kinds:
        old = getattr(handler, attr, None)
        if old is not None:
            return make(fn_of(old), request_deserializer=handler.request_deserializer,
                        response_serializer=handler.response_serializer)
    return None


def _as_client(behaviour):
    def run(request, context):
        _ROLE.role = CLIENT
        try:
            return behaviour(request, context)
        finally:
            _ROLE.role = CLUSTER
    return run


def _make_token_interceptor(token: str, client_token: Optional[str] = None):
    import grpc  # deferred: a heavy import; wire/ loads it only when credentials or a channel are made

    expected = token.encode()
    client = client_token.encode() if client_token else None

    def refuse(code, message: str):
        def fn_of(_old):
            def abort(request_or_iterator, context):
                context.abort(code, message)
            return abort
        return fn_of

    class TokenInterceptor(grpc.ServerInterceptor):
        def intercept_service(self, continuation, details: Any):
            if details.method.startswith(HEALTH_PREFIX):
                return continuation(details)
            role = _role(details.invocation_metadata, expected, client)
            if role == CLUSTER:
                return continuation(details)
            handler = continuation(details)
            if handler is None:
                return None
            if role == CLIENT:
                if details.method in CLIENT_METHODS:
                    return _with_handler(handler, _as_client)
                return _with_handler(handler, refuse(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{details.method}: a client token may only run graphs and read their fetches; "
                    "this call needs the cluster token"))
            has = any(k == TOKEN_METADATA for k, _ in details.invocation_metadata or ())
            msg = (f"{details.method}: the bearer token is wrong" if has else
                   f"{details.method}: this server requires a bearer token ('authorization: Bearer ...'); "
                   "give the client the server's token (--token-file or $ISTHMUS_TOKEN_FILE)")
            return _with_handler(handler, refuse(grpc.StatusCode.UNAUTHENTICATED, msg))

    return TokenInterceptor()
