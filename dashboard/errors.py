"""One error handler for the whole app: JSON under ``/api``, HTML elsewhere.

As in ``datasette/handle_exception.py``: every error, expected or not, goes through
:func:`handle`, so an API client always gets ``{"error": {...}}`` and a browser a page. A bad
parameter is a 400 that names the parameter; an unexpected exception is logged once with its
traceback and answered with a 500 that leaks nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify, render_template, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException, InternalServerError

log = logging.getLogger("vramscope.dashboard")


class BadParameter(HTTPException):
    """A query or path parameter that cannot be used; ``parameter`` names it."""

    code = 400

    def __init__(self, parameter: str, problem: str) -> None:
        super().__init__(f"parameter {parameter!r}: {problem}")
        self.parameter = parameter


class Unauthorized(HTTPException):
    code = 401
    description = ("a token is required: send 'Authorization: Bearer <token>' or open the page "
                   "once with ?token=<token>")


class ForbiddenHost(HTTPException):
    """A request for a non-loopback ``Host`` to a dashboard that has no token (403)."""

    code = 403


def error_body(exc: HTTPException) -> dict[str, Any]:
    error = {"status": exc.code, "title": exc.name, "message": exc.description}
    parameter = getattr(exc, "parameter", None)
    if parameter is not None:
        error["parameter"] = parameter
    return {"error": error}


def handle(exc: Exception) -> ResponseReturnValue:
    if not isinstance(exc, HTTPException):
        log.exception("unhandled error on %s %s", request.method, request.path)
        exc = InternalServerError("internal error; the dashboard log has the details")
    if exc.code is not None and 300 <= exc.code < 400:  # routing redirects (trailing slash)
        return exc.get_response()
    headers = {}
    if exc.code == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="vramscope"'
    valid_methods = getattr(exc, "valid_methods", None)  # MethodNotAllowed's
    if exc.code == 405 and valid_methods:
        headers["Allow"] = ", ".join(valid_methods)
    response: Response | str
    if request.path.startswith("/api/") or request.path == "/metrics":
        response = jsonify(error_body(exc))
    else:
        response = render_template("error.html", error=error_body(exc)["error"])
    return response, exc.code if exc.code is not None else 500, headers  # (always has one)


def init_app(app: Flask) -> None:
    app.register_error_handler(Exception, handle)
