"""Safe defaults: loopback unless a token is set, bearer-token auth, strict response headers.

Binding to any address other than loopback without ``dashboard.token`` is refused at start-up
(:func:`check_bind`): memory timelines and process names of an inference fleet are not for the
whole network. When a token is configured every request needs it, as ``Authorization: Bearer
<token>`` (scripts, Prometheus' ``authorization`` block) or as the ``vramscope_token`` cookie that a
browser gets by opening any page once with ``?token=<token>``. Comparisons are constant-time.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re

from flask import Flask, Response, redirect, request
from flask.typing import ResponseReturnValue
from vramscope.agent.errors import ConfigError
from werkzeug.wrappers import Response as BaseResponse

TOKEN_COOKIE = "vramscope_token"
log = logging.getLogger("vramscope.dashboard")

# Plotly injects two <style> elements (modebar and hover CSS). For the bundles whose injected CSS
# we know, CSP allows exactly those by hash, and no other inline style; for an unknown bundle the
# one documented exception is ``style-src 'unsafe-inline'`` (docs/dashboard.md). Scripts come only
# from this origin: no inline script, no eval (only SVG traces are used, never WebGL).
PLOTLY_STYLE_HASHES: dict[str, tuple[str, ...]] = {
    "4.1.1": ("'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='",  # the empty <style>
              "'sha256-ji27qzEtxXZW+7dun6UwjHXJ18e6WAin1VvNtkzIE/o='"),
}
_CSP_TEMPLATE = (
    "default-src 'self'; script-src 'self'; style-src 'self' {styles}; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


def plotly_bundle_version(path: str | os.PathLike[str]) -> str | None:
    """The version in the bundle's banner (``* plotly.js v4.1.1``)."""
    try:
        with open(path, "rb") as f:
            head = f.read(200).decode("ascii", "replace")
    except OSError:
        return None
    match = re.search(r"plotly\.js v(\d+\.\d+\.\d+)", head)
    return match.group(1) if match else None


def content_security_policy(plotly_version: str | None) -> str:
    hashes = PLOTLY_STYLE_HASHES.get(plotly_version or "")
    if hashes is None:
        log.warning("plotly.js %s: its injected CSS is not known to vramscope; allowing inline "
                    "styles (style-src 'unsafe-inline')", plotly_version)
        return _CSP_TEMPLATE.format(styles="'unsafe-inline'")
    return _CSP_TEMPLATE.format(styles=" ".join(hashes))


def security_headers(csp: str) -> dict[str, str]:
    return {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
            "Cross-Origin-Opener-Policy": "same-origin"}


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost`` (any case, trailing dot: DNS names are
    case-insensitive)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str) -> None:
    """Refuse to serve a non-loopback address without a token (raises ``ConfigError``)."""
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"refusing to listen on {host!r} without a token: set dashboard.token in the config "
            f"(or $VRAMSCOPE_DASHBOARD_TOKEN), or bind 127.0.0.1 with --host 127.0.0.1")


def token_matches(given: str | None, token: str) -> bool:
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8"))


def _bearer(header: str | None) -> str | None:
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip()
    return None


def init_app(app: Flask, token: str, plotly_js: str | os.PathLike[str]) -> None:
    """Install the token check (when ``token`` is set) and the security headers."""
    headers = security_headers(content_security_policy(plotly_bundle_version(plotly_js)))

    @app.after_request
    def _headers(response: Response) -> Response:
        for name, value in headers.items():
            response.headers.setdefault(name, value)
        if request.path.startswith("/api/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    if not token:
        app.before_request(_require_loopback_host)
        return

    @app.before_request
    def _require_token() -> ResponseReturnValue | None:
        query_token = request.args.get("token")
        if query_token is not None and request.method == "GET" and token_matches(query_token,
                                                                                  token):
            return _cookie_redirect(token)
        if token_matches(_bearer(request.headers.get("Authorization")), token):
            return None
        if token_matches(request.cookies.get(TOKEN_COOKIE), token):
            return None
        from vramscope.dashboard.errors import Unauthorized

        raise Unauthorized()


def _require_loopback_host() -> ResponseReturnValue | None:
    """Without a token only loopback names may be in ``Host``: a web page that re-points its own
    domain at 127.0.0.1 (DNS rebinding) must not read the API from a visitor's browser."""
    host = request.host.rsplit(":", 1)[0] if not request.host.endswith("]") else request.host
    if not is_loopback(host):
        from vramscope.dashboard.errors import ForbiddenHost

        raise ForbiddenHost(f"Host {request.host!r} is not a loopback name; without "
                            f"dashboard.token only localhost, 127.0.0.1 and [::1] are served")
    return None


def _cookie_redirect(token: str) -> BaseResponse:
    """Trade ``?token=`` for an HttpOnly cookie and drop the token from the address bar."""
    args = request.args.to_dict(flat=False)
    args.pop("token", None)
    from urllib.parse import urlencode

    query = urlencode(args, doseq=True)
    response = redirect(request.path + (f"?{query}" if query else ""), code=303)
    response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict",
                        secure=request.is_secure)
    return response
