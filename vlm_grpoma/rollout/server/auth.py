"""Who may talk to a rollout server: a secret shared by the trainer ranks and the servers
(``rollout.server.token_file``; ``rollout-server --token-file``).

Every request carries ``X-Rollout-Time`` (Unix seconds), ``X-Rollout-Nonce`` (random, once) and
``X-Rollout-Signature``: HMAC-SHA256 under the token over the method, the path, the time, the nonce and the
SHA-256 of the body. The server recomputes it and compares in constant time, refuses a time more than
:data:`MAX_SKEW_S` from its own clock and a nonce it has already accepted within that window (a replay), so a
caller without the token can neither push weights, sample, nor replay a captured request. The replies are not
signed and nothing is encrypted: the token keeps strangers out, it does not hide the traffic (see
docs/scaling.md, Security).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import stat
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from vlm_grpoma.errors import ConfigError

TIME_HEADER = "X-Rollout-Time"
NONCE_HEADER = "X-Rollout-Nonce"
SIGNATURE_HEADER = "X-Rollout-Signature"
#: Largest difference between a request's time and the server's clock, in seconds (both ways).
MAX_SKEW_S = 300.0
#: Shortest token accepted: 32 characters (``openssl rand -hex 32`` writes 64).
MIN_TOKEN_CHARS = 32
#: Longest nonce accepted (``signed_headers`` writes 32 hex characters).
MAX_NONCE_CHARS = 64


def read_token(path: str | Path, key: str = "rollout.server.token_file") -> bytes:
    """The token in ``path`` (surrounding whitespace dropped): a file only its owner can read, of at least
    :data:`MIN_TOKEN_CHARS` characters; one line naming ``key`` and the file otherwise."""
    file = Path(path).expanduser()
    try:
        mode = file.stat().st_mode
        token = file.read_bytes().strip()
    except FileNotFoundError:
        raise ConfigError(f"{key}: {file}: no such file (write one: openssl rand -hex 32 > {file})") from None
    except OSError as err:
        raise ConfigError(f"{key}: {file}: cannot read it ({err.strerror})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{key}: {file} can be read by other users (mode {stat.S_IMODE(mode):o}); chmod 600 {file}"
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"{key}: {file} holds {len(token)} characters, fewer than {MIN_TOKEN_CHARS} (openssl rand -hex 32)"
        )
    return token


def signature(token: bytes, method: str, path: str, timestamp: str, nonce: str, body: bytes) -> str:
    """The hex HMAC-SHA256 of one request (module docstring)."""
    message = "\n".join((method, path, timestamp, nonce, hashlib.sha256(body).hexdigest()))
    return hmac.new(token, message.encode(), hashlib.sha256).hexdigest()


def signed_headers(
    token: bytes, method: str, path: str, body: bytes, clock: Callable[[], float] = time.time
) -> dict[str, str]:
    """The three headers that authenticate one request."""
    timestamp, nonce = f"{clock():.3f}", secrets.token_hex(16)
    return {
        TIME_HEADER: timestamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: signature(token, method, path, timestamp, nonce, body),
    }


class RequestVerifier:
    """The server's side: :meth:`refusal` of a request, None when it is signed with the token, fresh and new."""

    def __init__(self, token: bytes, clock: Callable[[], float] = time.time, max_skew_s: float = MAX_SKEW_S):
        self._token, self._clock, self._skew = token, clock, max_skew_s
        self._seen: dict[str, float] = {}  # accepted nonce -> when it can be forgotten
        self._lock = threading.Lock()

    def refusal(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> str | None:
        """Why the request is refused (one line, naming no secret), or None."""
        timestamp, nonce, signed = (headers.get(h) for h in (TIME_HEADER, NONCE_HEADER, SIGNATURE_HEADER))
        if not (timestamp and nonce and signed):
            return "unauthenticated: this server needs requests signed with its token (rollout.server.token_file)"
        try:
            sent = float(timestamp)
        except ValueError:
            sent = math.nan
        now = self._clock()
        if not math.isfinite(sent) or len(nonce) > MAX_NONCE_CHARS:
            return "unauthenticated: malformed signature headers"
        expected = signature(self._token, method, path, timestamp, nonce, body)
        if not hmac.compare_digest(expected.encode(), signed.encode()):
            return "unauthenticated: wrong signature (not this server's token, or the request was altered)"
        if abs(now - sent) > self._skew:
            return f"unauthenticated: the request's time is {now - sent:+.0f} s off this server's clock"
        with self._lock:
            self._seen = {n: until for n, until in self._seen.items() if until > now}
            if nonce in self._seen:
                return "unauthenticated: a replayed request (its nonce was used already)"
            self._seen[nonce] = sent + 2 * self._skew
        return None


def is_loopback(host: str) -> bool:
    """``host`` names only this machine (127.0.0.0/8, ::1, localhost): no other machine can connect."""
    import ipaddress
    import socket

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


__all__ = [
    "MAX_SKEW_S",
    "RequestVerifier",
    "is_loopback",
    "read_token",
    "signature",
    "signed_headers",
]
