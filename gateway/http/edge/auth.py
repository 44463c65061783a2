"""Who may call what: API keys for producers/operators, scoped JWTs for subscribers.

The model (docs/protocol.md §3.3):

- **API keys** (`Settings.api_keys`) grant everything: producer, operator and subscriber
  routes. They are presented as `Authorization: Bearer <key>`, or as `X-Api-Key: <key>`
  (what the LangGraph SDK's `api_key=` sends; the Authorization header wins when both
  are present), never in a URL, where a key would end up in access logs and browser
  history. The presented key is compared with
  every configured key in constant time (SHA-256 digests, `hmac.compare_digest`, no
  early exit), so neither the matching key's position nor a prefix length leaks.
- **Subscriber tokens** are JWTs signed with `Settings.jwt_secret` (HS256, HS384 or
  HS512; every other `alg`, `none` included, is refused). A token signed with one of
  `Settings.jwt_previous_secrets` (older secrets, newest first) is accepted too, so a
  secret rotates without ending every live token at once: new tokens are signed with
  `jwt_secret`, and an old secret is dropped once the tokens it signed have expired.
  Claims:

  ``exp``       required, unix seconds; past it the token is refused with `token_expired`.
  ``runs``      list of run ids the token may read.
  ``sessions``  list of session ids; the token may read every run of these sessions and
                the session's turns.
  ``sub``       optional, free text; only ever used for logging.

  **App keys** (`Settings.jwt_app_keys`, `kid:secret` pairs) let an app mint tokens for
  its own users without holding the gateway-wide secret: a token whose JWT header names
  a `kid` is verified with that app key only (an unknown `kid` is refused, never tried
  against the other secrets), and must carry a `sessions` claim (a list) and an `exp`
  at most `APP_TOKEN_MAX_SECONDS` (an hour) ahead; anything else is 401. Such a token
  grants what any token grants (its `sessions` and `runs`), so a leaked app key reads
  only what the tokens it can mint name, for an hour at most, and is revoked by
  removing it from the list. A token without `kid` is checked as before.

  A token is accepted as `Authorization: Bearer <jwt>` or as the `access_token` query
  parameter (a browser `EventSource` cannot set headers); the header wins when both
  are present. A token covers a run when the run id is in `runs`, or when the session
  the run *is recorded under* is in `sessions`: callers must pass the run's stored
  session id, never one taken from the request path. Tokens never grant producer or
  operator routes.
- **Open mode**: no API key, no JWT secret and no app key configured. Everything is allowed; the
  command line only permits it on a loopback bind (see `gateway.cli`).

Each principal names who it is for the per-reader share of open streams
(`Principal.share_key`, `subscriptions.py`): an API key (by its position in the list),
a token's `sub`, or, for a token without one, the token itself. Open mode names nobody.

Errors: no or unusable credentials -> `Unauthorized` (401 `unauthorized`); an expired
token -> `TokenExpired` (401 `token_expired`); valid credentials that do not cover the
run or session -> `Forbidden` (403 `forbidden`).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import jwt

from ...errors import Forbidden, TokenExpired, Unauthorized
from ...settings import Settings, app_key_pairs

ALGORITHMS: Final[tuple[str, ...]] = ("HS256", "HS384", "HS512")
# The longest an app-key token may live (its `exp` from now, at the check), and how far
# ahead of the gateway's the minting app's clock may be.
APP_TOKEN_MAX_SECONDS: Final = 3600.0
APP_CLOCK_SKEW_SECONDS: Final = 30.0
JwtAlgorithm = Literal["HS256", "HS384", "HS512"]

__all__ = [
    "ALGORITHMS",
    "APP_TOKEN_MAX_SECONDS",
    "Authenticator",
    "Principal",
    "mint_subscriber_token",
]


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller. `full_access` is an API key or open mode."""

    full_access: bool
    runs: frozenset[str] = frozenset()
    sessions: frozenset[str] = frozenset()
    subject: str | None = None
    kind: Literal["open", "api_key", "token"] = "token"
    # unix seconds after which a token is refused (its `exp` plus the leeway); None: never
    expires_at: float | None = None
    # who holds the streams this principal opens (their per-reader share); None: open mode
    share_key: str | None = None

    def may_read_run(self, run_id: str, session_id: str | None) -> bool:
        if self.full_access or run_id in self.runs:
            return True
        return session_id is not None and session_id in self.sessions

    def may_read_session(self, session_id: str) -> bool:
        return self.full_access or session_id in self.sessions

    def check_run(self, run_id: str, session_id: str | None) -> None:
        if not self.may_read_run(run_id, session_id):
            raise Forbidden("this token does not grant access to this run")

    def check_session(self, session_id: str) -> None:
        if not self.may_read_session(session_id):
            raise Forbidden("this token does not grant access to this session")


_OPEN: Final = Principal(full_access=True, kind="open")


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:  # plain dicts are case-sensitive; Starlette's Headers is not
        lowered = name.lower()
        for key, candidate in headers.items():
            if key.lower() == lowered:
                return candidate
    return value


def _bearer(headers: Mapping[str, str]) -> str | None:
    """The credential of an `Authorization: Bearer ...` header, else of `X-Api-Key`.

    Unauthorized when either is garbled (an empty `X-Api-Key` included).
    """
    raw = _header(headers, "authorization")
    if raw is None:
        key = _header(headers, "x-api-key")
        if key is None:
            return None
        if not key.strip():
            raise Unauthorized("the X-Api-Key header is empty")
        return key.strip()
    scheme, _, credential = raw.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential:
        raise Unauthorized("the Authorization header must be 'Bearer <credential>'")
    return credential


def _id_list(claims: Mapping[str, Any], name: str) -> frozenset[str]:
    value = claims.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Unauthorized(f"token claim '{name}' must be a list of strings")
    return frozenset(value)


class Authenticator:
    """Checks credentials against the configured API keys and subscriber-token secret."""

    def __init__(
        self,
        api_keys: Iterable[str] = (),
        jwt_secret: str | None = None,
        *,
        previous_secrets: Iterable[str] = (),
        app_keys: Mapping[str, str] | None = None,
        leeway_seconds: float = 0.0,
    ) -> None:
        keys = [k for k in api_keys if k]
        self._key_digests: tuple[bytes, ...] = tuple(_digest(k) for k in keys)
        self._key_principals = tuple(
            Principal(full_access=True, kind="api_key", share_key=f"key:{index}")
            for index in range(len(keys))
        )
        self._jwt_secret = jwt_secret or None
        # Newest first: a current token verifies at the first try.
        self._jwt_secrets: tuple[str, ...] = (
            () if self._jwt_secret is None else (self._jwt_secret, *previous_secrets)
        )
        self._app_keys: dict[str, str] = dict(app_keys or {})  # kid -> secret
        self._leeway = leeway_seconds

    @classmethod
    def from_settings(cls, settings: Settings) -> Authenticator:
        return cls(
            settings.api_keys,
            settings.jwt_secret,
            previous_secrets=settings.jwt_previous_secrets,
            app_keys=app_key_pairs(settings.jwt_app_keys),
        )

    @property
    def open_mode(self) -> bool:
        """True when no API key, JWT secret or app key is configured: everything is allowed."""
        return not self._key_digests and self._jwt_secret is None and not self._app_keys

    @property
    def _takes_tokens(self) -> bool:
        return bool(self._jwt_secrets or self._app_keys)

    def _api_key(self, credential: str) -> Principal | None:
        """The principal of the API key `credential` is, if it is one."""
        presented = _digest(credential)
        matched: Principal | None = None
        for digest, principal in zip(self._key_digests, self._key_principals, strict=True):
            if hmac.compare_digest(presented, digest):  # every key, no early exit
                matched = principal
        return matched

    def _claims(self, token: str) -> dict[str, Any]:
        """The verified claims of `token`: with the app key its header names (`kid`),
        else trying each gateway secret, newest first."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise Unauthorized("invalid credentials") from None
        kid = header.get("kid")
        if kid is not None:
            return self._app_claims(token, kid)
        for secret in self._jwt_secrets:
            try:
                claims: dict[str, Any] = jwt.decode(
                    token,
                    secret,
                    algorithms=list(ALGORITHMS),
                    options={"require": ["exp"]},
                    leeway=self._leeway,
                )
            except jwt.InvalidSignatureError:
                continue  # signed with another secret (or forged): try the next one
            except jwt.ExpiredSignatureError:
                raise TokenExpired("the subscriber token has expired") from None
            except jwt.InvalidTokenError:
                raise Unauthorized("invalid credentials") from None
            return claims
        raise Unauthorized("invalid credentials")

    def _app_claims(self, token: str, kid: object) -> dict[str, Any]:
        """The claims of a token signed with app key `kid`, within an app token's limits."""
        secret = self._app_keys.get(kid) if isinstance(kid, str) else None
        if secret is None:
            raise Unauthorized("invalid credentials (unknown key id)")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                secret,
                algorithms=list(ALGORITHMS),
                options={"require": ["exp"]},
                leeway=self._leeway,
            )
        except jwt.ExpiredSignatureError:
            raise TokenExpired("the subscriber token has expired") from None
        except jwt.InvalidTokenError:
            raise Unauthorized("invalid credentials") from None
        if not isinstance(claims.get("sessions"), list):
            raise Unauthorized("a token signed with an app key must name its sessions")
        exp = claims["exp"]
        latest = time.time() + APP_TOKEN_MAX_SECONDS + APP_CLOCK_SKEW_SECONDS
        if not isinstance(exp, int | float) or exp > latest:
            raise Unauthorized(
                f"a token signed with an app key may live at most {APP_TOKEN_MAX_SECONDS:g} s"
            )
        return claims

    def _decode(self, token: str) -> Principal:
        claims = self._claims(token)
        subject = claims.get("sub")
        return Principal(
            full_access=False,
            runs=_id_list(claims, "runs"),
            sessions=_id_list(claims, "sessions"),
            subject=subject if isinstance(subject, str) else None,
            kind="token",
            expires_at=float(claims["exp"]) + self._leeway,
            share_key=(
                f"sub:{subject}"
                if isinstance(subject, str) and subject
                else "token:" + _digest(token).hex()[:32]
            ),
        )

    # -- producer / operator ------------------------------------------------------------

    def authorize_producer(self, headers: Mapping[str, str]) -> Principal:
        """Producer and operator routes: an API key in the Authorization header."""
        if self.open_mode:
            return _OPEN
        credential = _bearer(headers)
        if credential is None:
            raise Unauthorized("an API key is required (Authorization: Bearer <key>)")
        key = self._api_key(credential)
        if key is not None:
            return key
        if self._takes_tokens and credential.count(".") == 2:
            # A well-formed subscriber token on a producer route: authenticated, not allowed.
            self._decode(credential)
            raise Forbidden("subscriber tokens cannot be used on producer or operator routes")
        raise Unauthorized("invalid credentials")

    authorize_operator = authorize_producer

    # -- subscriber ---------------------------------------------------------------------

    def authenticate_subscriber(
        self, headers: Mapping[str, str], query_params: Mapping[str, str]
    ) -> Principal:
        """Who is reading: full access (API key, open mode) or a scoped token. Raises 401s."""
        if self.open_mode:
            return _OPEN
        credential = _bearer(headers)
        if credential is not None:
            key = self._api_key(credential)
            if key is not None:
                return key
            return self._decode(credential)
        token = query_params.get("access_token")
        if not token:
            raise Unauthorized(
                "credentials required: Authorization: Bearer <token> or ?access_token=<token>"
            )
        return self._decode(token)  # API keys are not accepted in URLs

    def authorize_subscriber(
        self,
        headers: Mapping[str, str],
        query_params: Mapping[str, str],
        run_id: str,
        session_id: str | None = None,
    ) -> Principal:
        """Reading one run. `session_id` must be the session the run is recorded under."""
        principal = self.authenticate_subscriber(headers, query_params)
        principal.check_run(run_id, session_id)
        return principal

    def authorize_session_reader(
        self, headers: Mapping[str, str], query_params: Mapping[str, str], session_id: str
    ) -> Principal:
        """Reading one session's turns."""
        principal = self.authenticate_subscriber(headers, query_params)
        principal.check_session(session_id)
        return principal


def mint_subscriber_token(
    secret: str,
    *,
    runs: Iterable[str] = (),
    sessions: Iterable[str] = (),
    ttl_seconds: float = 3600,
    subject: str | None = None,
    algorithm: JwtAlgorithm = "HS256",
    now: float | None = None,
    kid: str | None = None,
) -> str:
    """A subscriber token for `runs` and/or `sessions`, valid for `ttl_seconds`; `kid`
    names the app key `secret` is (`Settings.jwt_app_keys`; then at most an hour)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}")
    issued = time.time() if now is None else now
    claims: dict[str, Any] = {
        "iat": int(issued),
        "exp": int(issued + ttl_seconds),
        "runs": sorted(set(runs)),
        "sessions": sorted(set(sessions)),
    }
    if subject is not None:
        claims["sub"] = subject
    headers = None if kid is None else {"kid": kid}
    return jwt.encode(claims, secret, algorithm=algorithm, headers=headers)
