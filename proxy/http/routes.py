"""The HTTP reverse proxy's route: `ANY /http/{upstream}/{path...}`.

`setup_http(app)` adds the route, the per-tenant token budget, and a cleanup context that opens
one pooled `ClientSession` per configured HTTP upstream (`auto_decompress=False`: the bytes are
relayed as the upstream sent them; no cookie jar shared between callers; no environment proxies;
no headers of aiohttp's own). The handler checks the request (upstream, path, attributes, body)
and hands it to `proxy.http.pipeline.run_http_call`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from policies import answers
from policies.answers import CODE_INVALID_REQUEST, CODE_PARSE_ERROR, Answer
from policies.attributes import BadAttribute, read_attributes
from policies.classify import Classification, classify_http
from policies.deferral import prefers_async
from policies.json_limits import MAX_JSON_DEPTH, nests_deeper_than
from policies.token_budget import TokenBudget
from proxy.edge import guarded
from proxy.http.downstream import Downstream
from proxy.http.paths import UnsafePath, split_route, upstream_target
from proxy.http.pipeline import TOKEN_BUDGET, HttpCall, run_http_call
from proxy.http.upstream import HTTP_POOLS
from proxy.json_codec import loads
from proxy.runtime.http1 import Pool
from proxy.state import CONFIG, RUNTIME
from proxy.telemetry import tracing

__all__ = ["setup_http"]


_ROUTE = "/http/{upstream}/{path}"
_POLICY_CACHE_MAX = 1024  # distinct (upstream, method, path) decisions kept, least recent evicted

Classify = Callable[[str, str, str], Classification]
_CLASSIFIED: web.AppKey[Classify] = web.AppKey("http_classified")
"""`classify_http` of this app's configuration, by (upstream, method, path): the configuration is
fixed for the app's life and classification is a pure function of it, so a repeated path is
classified once (a bounded LRU: paths that carry ids keep the recent ones, not the first ones)."""


def setup_http(app: web.Application) -> None:
    """Add the HTTP proxy's route, token budget and pooled upstream sessions to `app`."""
    app[TOKEN_BUDGET] = TokenBudget(app[CONFIG].budgets, clock=time.monotonic)
    classify: Classify = functools.lru_cache(maxsize=_POLICY_CACHE_MAX)(
        functools.partial(classify_http, app[CONFIG])
    )
    app[_CLASSIFIED] = classify
    app.router.add_route("*", "/http/{upstream}", guarded(handle_http))
    app.router.add_route("*", "/http/{upstream}/{path:.*}", guarded(handle_http))
    app.cleanup_ctx.append(_upstream_pools)


async def _upstream_pools(app: web.Application) -> AsyncIterator[None]:
    pools: dict[str, Pool] = {}
    for name, spec in app[CONFIG].upstreams.items():
        if spec.kind == "http" and spec.url is not None:  # validation gives every http one a url
            pools[name] = Pool(URL(spec.url), limit=spec.max_connections)
    app[HTTP_POOLS] = pools
    yield
    await asyncio.gather(*(pool.close() for pool in pools.values()))


def _bad(reason: str, message: str, status: int = 400, code: int = CODE_INVALID_REQUEST) -> Answer:
    return answers.bad_request(code, reason, message, http_status=status)


def _reply(answer: Answer) -> web.Response:
    return web.json_response(answer.http_body(), status=answer.http_status)


async def handle_http(request: web.Request) -> web.StreamResponse:
    """Check one request to `/http/{upstream}/...` and proxy it."""
    config = request.app[CONFIG]
    try:
        name, tail = split_route(request.raw_path)
    except UnsafePath as exc:
        return _reply(_bad("unsafe_path", str(exc)))
    spec = config.upstreams.get(name)
    if spec is None or spec.kind != "http" or not spec.url:
        return _reply(_bad("unknown_upstream", f"No HTTP upstream named {name!r}.", 404))
    if request.method not in spec.allowed_methods:
        response = _reply(
            _bad("method_not_allowed", f"{request.method[:16]} is not forwarded to {name}.", 405)
        )
        response.headers["Allow"] = ", ".join(sorted(spec.allowed_methods))
        return response
    try:
        target = upstream_target(spec.url, tail, request.rel_url.raw_query_string)
        attrs = read_attributes(config, request.headers)
    except UnsafePath as exc:
        return _reply(_bad("unsafe_path", str(exc)))
    except BadAttribute as exc:
        return _reply(_bad(exc.reason, str(exc), exc.status, code=answers.CODE_INVALID_PARAMS))
    path = target.path  # rules, classification and the ledger see what the upstream runs
    policy = request.app[_CLASSIFIED](name, request.method, path)
    is_json = _is_json(request.content_type)
    respond_async = prefers_async(request.headers.getall("Prefer", ()))
    if not request.body_exists:
        body: bytes | aiohttp.StreamReader | None = None
    elif (
        policy.side_effect
        or policy.costly
        or is_json
        or respond_async
        or request.content_length is None
    ):
        # the proxy reads it (fingerprint, usage, retries), or it has no length to check up front
        body = await _read_capped(request, config.max_body_bytes)
        if body is None:
            return _reply(_too_large(config.max_body_bytes))
    elif request.content_length > config.max_body_bytes:
        return _reply(_too_large(config.max_body_bytes))
    else:
        body = request.content  # streamed through untouched
    payload: Any = None
    if policy.costly or is_json:
        payload, problem = _parse_json(body if isinstance(body, bytes) else b"", policy.costly)
        if problem is not None:
            return _reply(problem)
    model = payload.get("model") if isinstance(payload, dict) else None
    streaming = (isinstance(payload, dict) and payload.get("stream") is True) or (
        "text/event-stream" in request.headers.get("Accept", "")
    )
    operation = policy.gen_ai_operation
    if operation and isinstance(model, str):
        span_name = f"{operation} {model}"  # the GenAI convention for model calls
    else:
        span_name = tracing.http_span_name(request.method, _ROUTE)

    def attributes() -> dict[str, Any]:  # built only for a span that records them
        return {
            "interlock.upstream": name,
            "interlock.tenant": attrs.tenant,
            "interlock.class": policy.work_class or attrs.work_class,
            "http.request.method": request.method,
            "http.route": _ROUTE,
            "url.path": path,
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": model if isinstance(model, str) else None,
        }

    with (
        request.app[RUNTIME].call_in_flight(),
        tracing.call_span(span_name, attributes=attributes, headers=request.headers) as span,
    ):
        call = HttpCall(
            app=request.app,
            request=request,
            upstream=spec,
            target=target.url,
            tool=f"{request.method} {path}",
            attrs=attrs,
            policy=policy,
            body=body,
            payload=payload,
            deadline=time.monotonic() + attrs.deadline_s,
            span=span,
            downstream=Downstream(request, sse_while_waiting=streaming),
            respond_async=respond_async,
        )
        return await run_http_call(call)


def _is_json(content_type: str) -> bool:
    return content_type == "application/json" or content_type.endswith("+json")


def _too_large(cap: int) -> Answer:
    return _bad("body_too_large", f"The request body is larger than {cap} bytes.", 413)


async def _read_capped(request: web.Request, cap: int) -> bytes | None:
    """The whole request body, or None as soon as it exceeds `cap` bytes."""
    if request.content_length is not None and request.content_length > cap:
        return None
    parts: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > cap:
            return None
        parts.append(chunk)
    return b"".join(parts)


def _parse_json(body: bytes, must_be_object: bool) -> tuple[Any, Answer | None]:
    try:
        payload = loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return None, _bad(
            "invalid_json", f"The request body is not valid JSON: {exc}.", code=CODE_PARSE_ERROR
        )
    if nests_deeper_than(payload, raw=body):
        return None, _bad("too_deep", f"The request nests JSON more than {MAX_JSON_DEPTH} deep.")
    if must_be_object and not isinstance(payload, dict):
        return None, _bad("invalid_request", "A model API request body must be a JSON object.")
    return payload, None
