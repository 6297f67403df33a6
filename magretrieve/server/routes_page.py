"""``GET /`` (the search page), ``GET /docs`` (Swagger UI) and ``GET /static/…``: what a browser sees.

Everything a page loads is shipped in the package (``magretrieve/server/static``) and served
from this origin, so both pages work with no network (an air-gapped deployment, or a machine
behind a proxy) and no request leaves the server's own origin; a Content-Security-Policy
header makes the browser hold them to that. The search page holds no data: it reads ``/info``
and ``/ready`` and calls ``/search`` from the browser, so it is served without the API key
(the API it calls still requires it, sent as ``Authorization: Bearer`` from memory). ``/docs``
and the schema it reads, ``/openapi.json``, are open too: they describe the routes every
magretrieve server of this version has and hold no data. On a keyed server the schema
declares the bearer key on the routes that need it, so Swagger UI's "Authorize" and "Try it
out" send it; a ``/docs`` tab opened from the search page gets the key that page holds.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from magretrieve.server.auth import needs_key
from magretrieve.server.errors import NotServed

router = APIRouter()

#: Files under ``/static/`` (path → media type); nothing else is served from the package.
STATIC = {
    "page.css": "text/css; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "docs.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
    "swagger/swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger/swagger-ui.css": "text/css; charset=utf-8",
}

#: Same origin only: scripts, styles, fetches, images (figures as data: URIs), no framing.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
#: Swagger UI sets style attributes in its markup (React), so styles may be inline there.
DOCS_CSP = PAGE_CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


#: Name of the bearer-key security scheme in ``/openapi.json`` (and Swagger UI's "Authorize").
BEARER = "bearer"


@cache
def asset(name: str) -> bytes:
    """The bytes of one packaged file under ``static/`` (read once, kept)."""
    return resources.files("magretrieve.server").joinpath("static", *name.split("/")).read_bytes()


def _html(name: str, csp: str, **fields: str) -> Response:
    """A page with its ``{{field}}`` marks filled: ``{{head}}``, the start every page shares
    (``static/head.html``: doctype, meta tags, icon), and the page's own ``fields``."""
    text = asset(name).decode()
    fields = {"head": asset("head.html").decode().rstrip("\n"), **fields}
    for key, value in fields.items():
        text = text.replace("{{" + key + "}}", value)
    headers = {**SECURITY_HEADERS, "Content-Security-Policy": csp}
    return Response(text, media_type="text/html; charset=utf-8", headers=headers)


@router.get("/", include_in_schema=False)
async def page(request: Request) -> Response:
    """The search page; it asks for the key when this server has one."""
    keyed = request.app.state.magretrieve.settings.api_key is not None
    return _html("index.html", PAGE_CSP, key_required="true" if keyed else "false")


@router.get("/docs", include_in_schema=False)
async def docs() -> Response:
    """Swagger UI over ``/openapi.json``, from the packaged copy of swagger-ui-dist."""
    return _html("docs.html", DOCS_CSP, scheme=BEARER)


def declare_bearer_key(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI schema say which operations need ``Authorization: Bearer KEY``
    (the key is checked by the middleware, which FastAPI's schema does not see)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
            schemes[BEARER] = {
                "type": "http",
                "scheme": "bearer",
                "description": "This server's API key (serve --api-key / MAGRETRIEVE_API_KEY).",
            }
            for path, operations in schema.get("paths", {}).items():
                for method, operation in operations.items():
                    if needs_key(path, method):
                        operation["security"] = [{BEARER: []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


@router.get("/static/{name:path}", include_in_schema=False)
async def static(name: str) -> Response:
    media = STATIC.get(name)
    if media is None:
        raise NotServed(f"no static file {name!r}")
    headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "public, max-age=3600"}
    return Response(asset(name), media_type=media, headers=headers)
