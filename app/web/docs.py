"""The API's schema and its interactive documentation, behind the same tokens as everything else.

FastAPI's own `/docs`, `/redoc` and `/openapi.json` answer anyone; the app turns them off and serves
them here instead. With `PIPEBD_API_TOKENS` set, `/openapi.json` needs a `read` token (401 without,
like the API) and the documentation pages are dashboard pages: a browser without the `pipebd_token`
cookie is sent to the login page, and with it the pages' own fetch of `/openapi.json` is authorized
by that cookie. Without tokens they are open, as the rest of the service is.

The pages load Swagger UI and Redoc from app/static/vendor (under the open `/static`), not FastAPI's
default CDN, so they render on machines without internet access; Redoc is told to skip Google Fonts.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse

from app.api.auth import require
from app.web.access import ViewerDep
from app.web.routing import PageRoute

OPENAPI_URL = "/openapi.json"
DOCS_URL = "/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
REDOC_URL = "/redoc"
SWAGGER_UI = "/static/vendor/swagger-ui-5.35.0"
REDOC = "/static/vendor/redoc-2.5.4"
FAVICON = "/static/favicon.svg"

schema_router = APIRouter(dependencies=[Depends(require("read"))])
pages_router = APIRouter(route_class=PageRoute)


def _prefixed(request: Request, path: str) -> str:
    return request.scope.get("root_path", "").rstrip("/") + path


@schema_router.get(OPENAPI_URL, include_in_schema=False)
def openapi_schema(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@pages_router.get(DOCS_URL, include_in_schema=False)
def swagger_ui(request: Request, _: ViewerDep) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=_prefixed(request, OPENAPI_URL),
        title=f"{request.app.title} - Swagger UI",
        oauth2_redirect_url=_prefixed(request, OAUTH2_REDIRECT_URL),
        swagger_js_url=_prefixed(request, f"{SWAGGER_UI}/swagger-ui-bundle.js"),
        swagger_css_url=_prefixed(request, f"{SWAGGER_UI}/swagger-ui.css"),
        swagger_favicon_url=_prefixed(request, FAVICON),
    )


@pages_router.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
def swagger_ui_redirect(_: ViewerDep) -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@pages_router.get(REDOC_URL, include_in_schema=False)
def redoc(request: Request, _: ViewerDep) -> HTMLResponse:
    return get_redoc_html(
        openapi_url=_prefixed(request, OPENAPI_URL),
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=_prefixed(request, f"{REDOC}/redoc.standalone.js"),
        redoc_favicon_url=_prefixed(request, FAVICON),
        with_google_fonts=False,
    )
