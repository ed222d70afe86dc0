"""``artsdk view``: a web page over the trajectory store, served on 127.0.0.1.

    artsdk view [--store URL] [--port 7800] [--host 127.0.0.1] [--api-key-file FILE]

One page (``static/``: plain HTML, CSS and JavaScript, shipped in the package, nothing
fetched from the internet, no build step) and a JSON API it reads:

    GET /api/projects                                   projects, models, trajectory counts
    GET /api/curve?project=&model=                      reward per step (mean, spread) and training metrics
    GET /api/groups?project=&model=&step=&offset=       a page of a step's groups and their members
    GET /api/trajectories?project=&model=&rollout=&min_step=&max_step=&min_reward=&max_reward=&errors=&offset=
    GET /api/trajectories/{id}                          one trajectory whole, with its tokens' text
    GET /api/scenarios?project=&model=&step=            scenarios of a step (to compare)
    GET /api/compare?project=&model=&scenario=&a=&b=    one scenario's trajectories at two steps

With a key (``--api-key-file``, or ``ARTSDK_VIEW_KEY``) every request needs it: as
``Authorization: Bearer <key>``, or once as ``?key=<key>`` in the page's address, which sets
a cookie for the rest of the visit.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Optional

from ..store import Store
from .queries import PAGE, Views
from .tokens import token_texts

STATIC = Path(__file__).parent / "static"


def build_app(store: Store, api_key: Optional[str] = None) -> Any:
    from fastapi import FastAPI, HTTPException, Query, Request
    from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
    from fastapi.staticfiles import StaticFiles

    views = Views(store)
    app = FastAPI(title="artsdk view", version="1")

    @app.middleware("http")
    async def key_check(request: Request, call_next: Any) -> Any:
        if api_key is None:
            return await call_next(request)
        given = request.query_params.get("key") or request.cookies.get("artsdk_key") or \
            request.headers.get("authorization", "").removeprefix("Bearer ")
        if not secrets.compare_digest(given.encode(), api_key.encode()):
            return JSONResponse({"error": "this viewer needs its key: open it as /?key=<key>"}, status_code=401)
        if request.query_params.get("key"):  # remembered for the visit, and taken out of the address
            response = RedirectResponse(str(request.url.remove_query_params("key")), status_code=303)
            response.set_cookie("artsdk_key", api_key, httponly=True, samesite="strict")
            return response
        return await call_next(request)

    @app.get("/", include_in_schema=False)
    async def page() -> Any:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/api/projects")
    def projects() -> Any:
        return views.projects()

    @app.get("/api/curve")
    def curve(project: str, model: str) -> Any:
        return views.curve(project, model)

    @app.get("/api/groups")
    def groups(project: str, model: str, step: int, offset: int = Query(0, ge=0),
               limit: int = Query(PAGE, ge=1, le=500)) -> Any:
        return views.groups(project, model, step, offset, limit)

    @app.get("/api/trajectories")
    def trajectories(project: Optional[str] = None, model: Optional[str] = None, rollout: Optional[str] = None,
                     min_step: Optional[int] = None, max_step: Optional[int] = None,
                     min_reward: Optional[float] = None, max_reward: Optional[float] = None, errors: bool = False,
                     offset: int = Query(0, ge=0), limit: int = Query(PAGE, ge=1, le=500)) -> Any:
        return views.trajectories(project=project, model=model, rollout=rollout, min_step=min_step,
                                  max_step=max_step, min_reward=min_reward, max_reward=max_reward, errors=errors,
                                  offset=offset, limit=limit)

    @app.get("/api/trajectories/{trajectory_id}")
    def trajectory(trajectory_id: str) -> Any:
        from ..errors import StoreError

        try:
            t = views.trajectory(trajectory_id)
        except (KeyError, StoreError):
            raise HTTPException(404, f"no trajectory {trajectory_id[:80]!r} in this store") from None
        return with_token_texts(views, t)

    @app.get("/api/scenarios")
    def scenarios(project: str, model: str, step: int) -> Any:
        return views.scenarios(project, model, step)

    @app.get("/api/compare")
    def compare(project: str, model: str, scenario: str, a: int, b: int) -> Any:
        out = views.compare(project, model, scenario, a, b)
        for side in ("a", "b"):
            out[side] = [with_token_texts(views, t) for t in out[side]]
        return out

    return app


def with_token_texts(views: Views, t: dict[str, Any]) -> dict[str, Any]:
    """Each sampled choice gets ``token_texts`` beside its ids, when the model's tokenizer is here."""
    base = views.base_model(t.get("project"), t.get("model"))
    for call in t.get("calls") or ():
        for choice in call.get("choices") or ():
            if choice.get("token_ids"):
                choice["token_texts"] = token_texts(base, choice["token_ids"])
    return t


def serve(store: Optional[str] = None, host: str = "127.0.0.1", port: int = 7800,
          api_key: Optional[str] = None) -> None:
    """Run the viewer until interrupted."""
    import uvicorn

    app = build_app(Store(store) if store else Store(), api_key)
    shown = "localhost" if host in ("127.0.0.1", "::1") else host
    print(f"artsdk view: http://{shown}:{port}/" + ("?key=<your key>" if api_key else ""), flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
