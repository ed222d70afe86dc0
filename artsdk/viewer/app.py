"""``artsdk view``: a web page over the trajectory store, served on 127.0.0.1.

    artsdk view [--store URL] [--port 7800] [--host 127.0.0.1] [--api-key-file FILE]

One page (``static/``: plain HTML, CSS and JavaScript, shipped in the package, nothing
fetched from the internet, no build step) and a JSON API it reads:

    GET /api/projects                                   projects, models, trajectory counts
    GET /api/curve?project=&model=&run=                 a run's reward per step (mean, spread), its metrics, the runs
    GET /api/groups?project=&model=&step=&run=&offset=  a page of a step's groups and their members
    GET /api/trajectories?project=&model=&run=&rollout=&min_step=&max_step=&min_reward=&max_reward=&errors=&offset=
    GET /api/trajectories/{id}                          one trajectory whole, with its tokens' text
    GET /api/scenarios?project=&model=&step=            scenarios of a step (to compare)
    GET /api/compare?project=&model=&scenario=&a=&b=    one scenario's trajectories at two steps

With a key (``--api-key-file``, or ``ARTSDK_VIEW_KEY``) every request needs it: as
``Authorization: Bearer <key>``, or once as ``?key=<key>`` in the page's address, which sets
a cookie for the rest of the visit. Requests must name the address the viewer serves in their
``Host`` header: a web page elsewhere cannot read a viewer on 127.0.0.1 by pointing a domain
of its own at it (DNS rebinding).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Optional

from ..store import Store
from .queries import PAGE, Views
from .tokens import token_texts

STATIC = Path(__file__).parent / "static"


INT = {"ge": -(2**63), "le": 2**63 - 1}  # what SQL can compare against


def is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, port: int) -> Optional[set[str]]:
    """The ``Host`` headers a viewer bound to ``host``:``port`` answers (None: any, when it
    listens on every address and cannot know its names)."""
    if host in ("0.0.0.0", "::", ""):
        return None
    names = {"localhost", "127.0.0.1", "[::1]", host} if is_loopback(host) else set()
    names.add(f"[{host}]" if ":" in host else host)
    names.discard("::1")
    return {f"{n}:{port}" for n in names} | (names if port == 80 else set())


def build_app(store: Store, api_key: Optional[str] = None, hosts: Optional[set[str]] = None) -> Any:
    from fastapi import FastAPI, HTTPException, Query, Request
    from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
    from fastapi.staticfiles import StaticFiles

    views = Views(store)
    app = FastAPI(title="artsdk view", version="1")

    @app.middleware("http")
    async def key_check(request: Request, call_next: Any) -> Any:
        if hosts is not None and request.headers.get("host", "").lower() not in hosts:
            return JSONResponse({"error": f"this viewer answers requests for {sorted(hosts)[0]}, not for "
                                          f"{request.headers.get('host', '')[:100]!r}"}, status_code=421)
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
    def curve(project: str, model: str, run: Optional[str] = None) -> Any:
        return views.curve(project, model, run)

    @app.get("/api/groups")
    def groups(project: str, model: str, step: int = Query(..., **INT), offset: int = Query(0, ge=0, le=INT["le"]),
               limit: int = Query(PAGE, ge=1, le=500), run: Optional[str] = None) -> Any:
        return views.groups(project, model, step, offset, limit, run)

    @app.get("/api/trajectories")
    def trajectories(project: Optional[str] = None, model: Optional[str] = None, run: Optional[str] = None,
                     rollout: Optional[str] = None,
                     min_step: Optional[int] = Query(None, **INT), max_step: Optional[int] = Query(None, **INT),
                     min_reward: Optional[float] = None, max_reward: Optional[float] = None, errors: bool = False,
                     offset: int = Query(0, ge=0, le=INT["le"]), limit: int = Query(PAGE, ge=1, le=500)) -> Any:
        return views.trajectories(project=project, model=model, run=run, rollout=rollout, min_step=min_step,
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
    def scenarios(project: str, model: str, step: int = Query(..., **INT), run: Optional[str] = None) -> Any:
        return views.scenarios(project, model, step, run=run)

    @app.get("/api/compare")
    def compare(project: str, model: str, scenario: str, a: int = Query(..., **INT), b: int = Query(..., **INT),
                run: Optional[str] = None) -> Any:
        try:
            out = views.compare(project, model, scenario, a, b, run)
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
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
    """Run the viewer until interrupted. A ``store`` path that does not exist is refused (a
    mistyped path would otherwise show an empty store, made on the spot)."""
    import sys

    import uvicorn

    from ..errors import StoreError

    if store and "://" not in store and not Path(store).expanduser().is_file():
        raise StoreError(f"there is no store at {store}: give the path of an existing store (the default is "
                         f"<home>/store.db; `artsdk config` shows the settings)")
    if not is_loopback(host) and not api_key:
        print(f"artsdk view: warning: listening on {host} without a key: anyone who can reach it can read every "
              f"trajectory. Pass --api-key-file or set ARTSDK_VIEW_KEY.", file=sys.stderr, flush=True)
    app = build_app(Store(store) if store else Store(), api_key, allowed_hosts(host, port))
    shown = "localhost" if host in ("127.0.0.1", "::1") else host
    print(f"artsdk view: http://{shown}:{port}/" + ("?key=<your key>" if api_key else ""), flush=True)
    from ..slow_clients import KEEP_ALIVE, GuardedH11

    uvicorn.run(app, host=host, port=port, log_level="warning", http=GuardedH11, timeout_keep_alive=KEEP_ALIVE)
